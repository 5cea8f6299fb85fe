"""A server-like loop (2 torch threads: conv forward and backward, a 5 ms wait every 4 steps) alone, beside N
client-like processes in Linux's idle class (``chrt --idle 0``; 1 torch thread each, a conv step then 20 ms of
sleep), and beside the same N at normal priority. Prints the loop's wall seconds and the share of its wall time
its threads spent runnable but waiting for a core (``/proc/self/task/*/schedstat``, field 2).

    python idle_neighbours.py 10
"""
import os, subprocess, sys, time
n = int(sys.argv[1])
import torch
torch.set_num_threads(2)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                          torch.nn.Conv2d(128, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                          torch.nn.Linear(128 * 7 * 7, 10))
x = torch.randn(32, 64, 14, 14); y = torch.randint(0, 10, (32,))
def schedstat():
    tot = [0, 0]
    for t in os.listdir("/proc/self/task"):
        a = open(f"/proc/self/task/{t}/schedstat").read().split()
        tot[0] += int(a[0]); tot[1] += int(a[1])
    return tot
def work(k=80):
    s0 = schedstat(); t = time.perf_counter()
    for i in range(k):
        net.zero_grad(); torch.nn.functional.cross_entropy(net(x), y).backward()
        if i % 4 == 3: time.sleep(0.005)  # the server waits for a reply now and then
    s1 = schedstat(); w = time.perf_counter() - t
    return round(w, 2), round((s1[1] - s0[1]) / 1e9 / w, 2)
CLIENT = ("import torch,time\ntorch.set_num_threads(1)\nnet=torch.nn.Sequential(torch.nn.Conv2d(1,32,5),torch.nn.ReLU(),"
          "torch.nn.Conv2d(32,64,5),torch.nn.Flatten(),torch.nn.LazyLinear(10))\nx=torch.randn(32,1,28,28)\n"
          "while True:\n  net(x).sum().backward(); time.sleep(0.02)\n")
work(5)
for mode in ["alone", f"{n} idle", f"{n} normal", "alone"]:
    procs = []
    if mode != "alone":
        pre = ["chrt", "--idle", "0"] if "idle" in mode else []
        procs = [subprocess.Popen(pre + [sys.executable, "-c", CLIENT]) for _ in range(n)]; time.sleep(4)
    print(mode, "wall s, runq-wait share:", work(), flush=True)
    for p in procs: p.kill(); p.wait()
