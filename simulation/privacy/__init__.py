"""Privacy measurements: what the server received (:mod:`.record`) and the model-inversion attack on it
(:mod:`.inversion`, :mod:`.attack`: ``sflower attack RUN_DIR``)."""
