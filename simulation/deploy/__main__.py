"""``python -m simulation.deploy supernode [flower-supernode args]``: the ``fast=true`` SuperNode launcher."""

import sys

from simulation.deploy.supernode import UnpatchableFlower, supernode_main

if len(sys.argv) > 1 and sys.argv[1] == "supernode":
    try:
        supernode_main(sys.argv[2:])
    except UnpatchableFlower as err:
        print(f"sflower: {err}", file=sys.stderr)
        sys.exit(2)
else:
    print("usage: python -m simulation.deploy supernode [flower-supernode args]  (or: sflower deploy ...)",
          file=sys.stderr)
    sys.exit(2)
