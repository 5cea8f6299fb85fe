"""What a client does to keep its data from the server (threat model: docs/results/privacy.md).

* :mod:`fl_app.privacy.activations`: defences on the activations a client uploads (clipping, noise) and the
  evaluator's record of what it sent.
* :mod:`fl_app.privacy.label_defence`: the label-leakage defences of a U-shaped client (max-norm, iso,
  Marvell); :mod:`fl_app.privacy.marvell` solves Marvell's covariances (Li et al., ICLR 2022, §4).
* :mod:`fl_app.privacy.hidden`: client-side models hidden from the server (the clients' group key, sealed
  model states).

Imports: ``fl_app`` only: :mod:`fl_app.run` and :mod:`fl_app.learning`.
"""
