"""``python -m simulation.deploy supernode|supernode-fast [flower-supernode args]``: the SuperNode launcher
(:mod:`simulation.deploy.supernode`; ``supernode-fast`` for ``fast=true``)."""

import sys

from simulation.deploy.supernode import UnpatchableFlower, supernode_main

if len(sys.argv) > 1 and sys.argv[1] in ("supernode", "supernode-fast"):
    try:
        supernode_main(sys.argv[2:], fast=sys.argv[1] == "supernode-fast")
    except UnpatchableFlower as err:
        print(f"sflower: {err}", file=sys.stderr)
        sys.exit(2)
else:
    print("usage: python -m simulation.deploy supernode|supernode-fast [flower-supernode args]  "
          "(or: sflower deploy ...)", file=sys.stderr)
    sys.exit(2)
