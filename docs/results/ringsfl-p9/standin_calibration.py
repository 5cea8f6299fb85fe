"""How much the authors' data path costs with real torchvision, against the local stand-in used for P9.

The RingSFL authors' one-process simulation (``ShenJinglong/StalRingSFL``, ``utils/data_utils.py``)
loads MNIST through torchvision: per sample a PIL image, ``ToTensor`` and ``Normalize((0.5,), (0.5,))``,
in ``DataLoader``s of B = 64 that drop the last partial batch. torchvision does not import on the
development machine, so P9 runs their code with a local stand-in (never committed) that does the same
per-sample work. This script times that data path alone, as one v2 round of P9 reads it (5 label-sorted
loaders x 2 epochs, then the test loader: 129,664 samples), with real torchvision or with the stand-in,
so that the stand-in's fairness is measured rather than assumed.

    python standin_calibration.py real       # needs torchvision (it ran on the GPU machine's CPU)
    python standin_calibration.py standin    # the stand-in's package in ./tv/torchvision (not committed)

MNIST's four ``*-ubyte.gz`` files must lie beside this script. Prints seconds per pass, 3 passes.
"""

import gzip
import os
import shutil
import sys
import time

which = sys.argv[1] if len(sys.argv) > 1 else ""
if which not in ("real", "standin"):
    sys.exit("usage: standin_calibration.py real|standin")
here = os.path.dirname(os.path.abspath(__file__))
if which == "standin":
    sys.path.insert(0, os.path.join(here, "tv"))
    os.environ["TV_MNIST_DIR"] = here

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402

torch.set_num_threads(1)
print(which, "torchvision", getattr(torchvision, "__version__", "stand-in"), "torch", torch.__version__, flush=True)
root = os.path.join(here, "root")
raw = os.path.join(root, "MNIST", "raw")
os.makedirs(raw, exist_ok=True)
for f in os.listdir(here):
    if f.endswith(".gz"):
        shutil.copy(os.path.join(here, f), raw)
        with gzip.open(os.path.join(here, f)) as s, open(os.path.join(raw, f[:-3]), "wb") as d:
            d.write(s.read())
tf = torchvision.transforms.Compose([torchvision.transforms.ToTensor(),
                                     torchvision.transforms.Normalize((0.5,), (0.5,))])
kw = {} if which == "standin" else {"download": False}
train = torchvision.datasets.MNIST(root, train=True, transform=tf, **kw)
test = torchvision.datasets.MNIST(root, train=False, transform=tf, **kw)
order = np.argsort(train.targets)
step = len(train) // 5
loaders = [torch.utils.data.DataLoader(torch.utils.data.Subset(train, order[step * i:step * (i + 1)]),
                                       batch_size=64, shuffle=True, drop_last=True) for i in range(5)]
test_loader = torch.utils.data.DataLoader(test, batch_size=64, shuffle=False, drop_last=True)
for rep in range(3):
    t0 = time.perf_counter()
    n, s = 0, 0.0
    for _ in range(2):
        for batches in zip(*loaders):
            for x, y in batches:
                n += len(y)
                s += float(x[0, 0, 14, 14])  # touch the batch
    for x, y in test_loader:
        n += len(y)
    print(which, "pass", rep, "samples", n, "seconds", round(time.perf_counter() - t0, 3), flush=True)
