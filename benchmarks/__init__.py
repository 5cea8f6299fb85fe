"""``sflower bench``: the system's own speed, measured side by side in one run (a package, one module a benchmark).

Not part of the test suite. The benchmarks, each printing its figures and
ratios (this machine is shared and noisy, so compare within one run):

* ``engine``: the same GAS runs in-process and on the Ray engine with 1, 2
  and all CPUs (a core sweep): a short mnist-5k run where fixed costs
  dominate, and (not with ``--quick``) the paper's Fashion-MNIST setting;
  wall times, their ratios, Ray's start-up and the client parallelism it
  reached (see :mod:`benchmarks.engine`). With ``--against REV``: the
  small run in-process only, REV and the working tree alternately.
* ``liveness``: the main job's time to first output and its longest gap
  between output changes, on a pipe (see :mod:`benchmarks.liveness`).
* ``throughput``: client iterations per second for GAS on Fashion-MNIST at
  the paper's settings (K=20, C=10, E=20, B=32, shard=2). With
  ``--against REV`` (e.g. ``HEAD``) it runs that git revision and the working
  tree alternately and reports seconds per global iteration and their ratio.
* ``scale``: 10, 100 and 1,000 registered virtual clients with 10
  concurrent: resident memory after setup and after the run, peak memory, and
  time per global iteration, each size in a fresh subprocess.
* ``generation``: time per server update of sampling generated activations,
  straightforward vs. ours, and the resident memory of the statistics for
  100 labels at D=4096, old (``--against``, default HEAD) vs. new (see
  :mod:`benchmarks.generation`).
* ``memory``: peak client memory of one client step, zeroth-order against
  first-order (see :mod:`benchmarks.memory`).
* ``summary`` (only when named, with ``--against REV``): the headline
  figures of the above, REV and the working tree side by side in one table
  (see :mod:`benchmarks.summary`).
* ``ring``: one RingSFL round (LeNet-5, MNIST, 5 clients, 8:1:1:1:1) on the
  in-process and Ray engines against a one-process oracle doing the same
  arithmetic on the same batches (see :mod:`benchmarks.ring`). With
  ``--against REV``: one in-process round, REV and the working tree alternately.

``throughput`` and ``scale`` are in :mod:`benchmarks.throughput` and
:mod:`benchmarks.scale`; :mod:`benchmarks.runner` runs the named
ones; :mod:`benchmarks.common` holds what they share (data
directories, planning a run, running another revision's tree). ``sflower
deploy bench`` is :mod:`benchmarks.deploy`.
"""
