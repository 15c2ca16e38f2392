"""An arm run whose learned feed-forward becomes exact K control steps after the plant change.

`gpdyn control kuka|arm ...` as usual, except that from step ``change_at + K`` on, the controllers with a learned
feed-forward use the plant's own inverse dynamics instead (what the `true` controller uses, the change
included): a learner that had identified the change perfectly within K steps. The after-change tracking
error of such a run is the least any online model identifying the change in K steps can reach with this
feedback, the transient of the first K steps included.

    python docs/results/arm-change-floor/exact_after.py K [--change-at S] gpdyn-arguments...
    python docs/results/arm-change-floor/exact_after.py 5 control kuka --change joint-friction \
        --controllers online --no-gp-online --seed 2710 --out logs/exact5-2710

``--change-at`` tells this script the change's step when the run gives another than the recipe's 200.
"""

import sys

from gpdyn.cli import main
from gpdyn.control.computed_torque import ComputedTorqueController


def exact_after(step: int) -> None:
    """Patch the controller: from control step ``step`` on, a learned feed-forward is the plant's own."""
    learned_act = ComputedTorqueController.act

    def act(self, obs, info):  # type: ignore[no-untyped-def]
        if self.feedforward != "learned" or info["t"] < step * self.dt - 1e-9:
            return learned_act(self, obs, info)
        self.feedforward = "true"
        try:
            return learned_act(self, obs, info)
        finally:
            self.feedforward = "learned"

    ComputedTorqueController.act = act


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or not args[0].isdigit():
        sys.exit(__doc__)
    k, rest, change_at = int(args[0]), args[1:], 200
    if rest[:1] == ["--change-at"]:
        change_at, rest = int(rest[1]), rest[2:]
    exact_after(change_at + k)
    sys.exit(main(rest))
