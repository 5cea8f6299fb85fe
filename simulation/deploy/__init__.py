"""A scripted loopback deployment: a SuperLink, N SuperNodes with their own data, ``flwr run``.

``sflower deploy nodes=N [deploy options] [run-config KEY=VALUE ...]`` rehearses
on one machine what a real deployment does on many (docs: how-to, deployment):

1. each node's training data is written to ``RUN_DIR/data/partition-K``
   (:func:`fl_app.learning.task.write_partition_dirs`, the ``sflower partition`` code);
2. TLS certificates are made with ``openssl`` (:data:`OPENSSL_COMMANDS`: a CA,
   and a server certificate for ``localhost``/``127.0.0.1`` signed by it) and
   one ECDSA P-384 key pair per SuperNode with ``ssh-keygen``
   (:data:`SSH_KEYGEN_COMMAND`);
3. a SuperLink starts with ``--ssl-* --enable-supernode-auth`` on a free
   loopback port; each authorised node's public key is registered with
   ``flwr supernode register`` (Flower 1.41 replaced ``--auth-list-public-keys``
   with this Control API call);
4. N SuperNodes start, each with ``--root-certificates``, its private key and
   ``--node-config 'data-dir="RUN_DIR/data/partition-K" partition-id=K'``;
   ``intruders=M`` more start with keys that were never registered (they are
   refused, and the run goes on with the N others after ``join-timeout``);
5. ``flwr run . sflower-deploy --stream`` runs the app with the wall clock
   and ``output-dir=RUN_DIR/out``; the script waits for ``summary.json``
   (``flwr run`` may exit 0 when the run failed);
6. every process it started (and their children: SuperExecs, the ServerApp
   and ClientApp processes) is stopped, also on Ctrl-C, SIGTERM and failure.

Logs go to ``RUN_DIR/logs``. ``RUN_DIR/out/config.json`` holds the run
configuration only: no key, certificate or node data path.

Deploy options (not run-config keys): ``nodes``, ``intruders``, ``tls``,
``auth``, ``fast``, ``isolation``, ``run-dir``, ``timeout``, ``kill-node``,
``kill-after``, ``restart-after``, ``chaos``, ``chaos-seed``, ``kill-server-after``
(:mod:`simulation.deploy.faults`); see :data:`DEPLOY_DEFAULTS`.

``fast=true`` applies the latency settings measured in
``sflower deploy bench`` (docs: deployment; performance, "Exchange latency"): SuperExec
task polling every 20 ms (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, a Flower
setting) and the SuperNode's idle sleep cut from Flower's hard-coded 3 s to
20 ms (a patch applied by
:func:`simulation.deploy.supernode.supernode_main`, which starts the SuperNode
through ``python -m simulation.deploy supernode ...``).

The package, one concern a module:

* :mod:`simulation.deploy.options`: the deploy options and their parsing;
* :mod:`simulation.deploy.keys`: TLS certificates and SuperNode key pairs;
* :mod:`simulation.deploy.processes`: starting, watching and stopping processes;
* :mod:`simulation.deploy.cluster`: the SuperLink and SuperNodes on loopback
  (:class:`~simulation.deploy.cluster.Deployment`);
* :mod:`simulation.deploy.faults`: the faults a run injects and the restarts after them;
* :mod:`simulation.deploy.run`: one deployment from start to summary
  (:func:`~simulation.deploy.run.deploy`);
* :mod:`simulation.deploy.supernode`: the ``fast=true`` SuperNode launcher
  (``python -m simulation.deploy supernode``).

Imports: ``fl_app``, ``strategies`` and ``simulation``; nothing from ``benchmarks``.
"""
