"""The spline sampler's recipes from `gpdyn control walker --recipe NAME`: ``walker-sampling`` and ``walker-learned``.

Two recipe kinds run Walker2d under the predictive-sampling planner
(:class:`gpdyn.control.spline_sampling.SplineSampler`) instead of the legged MPC run:

- ``walker-sampling`` (:mod:`gpdyn.experiments.walk_true_model`): one episode per seed with
  the plant's own model as the planning model;
- ``walker-learned`` (:mod:`gpdyn.experiments.walk_learned_model`): a plant change, and
  per seed one episode under each of the true, the frozen (nominal) and the online-learned
  planning model.

:func:`add_sampling_options` adds the options these recipes take beyond those the walker's
command already has (``--recipe``, ``--steps``, ``--samples``, ``--horizon``,
``--controllers``, ``--out``: the same meaning here, their default the recipe's);
:func:`run_sampling_recipe` runs a recipe of either kind with the options given over its
values, into a run folder with ``report.md``, ``metrics.jsonl``, ``config.json`` and
``recipe.json`` (the recipe and the options given). An option of the legged run given with
such a recipe is refused, naming it. :func:`is_sampling_recipe` tells, reading only the
recipe's file, whether a recipe is of these kinds.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gpdyn.cli.common import COUNT, NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, SEED, Number
from gpdyn.errors import InputError

SAMPLING_KINDS = ("walker-sampling", "walker-learned")
#: what the online planning model learns (gpdyn.experiments.walk_learned_model.MODELS, listed here without importing it)
LEARNED_MODELS = ("parameters", "residual", "parameters+residual")
#: options the walker's command has that these recipes take too, with the same meaning
SHARED_OPTIONS = ("steps", "samples", "horizon", "controllers", "out")
#: the options (dests) each kind takes
KIND_OPTIONS = {
    "walker-sampling": ("seeds", "steps", "samples", "horizon"),
    "walker-learned": ("seeds", "steps", "samples", "horizon", "controllers", "changes", "explore_std", "learned_model",
                       "hybrid_kernel", "hybrid_learner", "hybrid_linear_inputs", "hybrid_space", "hybrid_noise", "learned_window",
                       "eval_every", "combine"),
}
#: options of a parser that are the process's, not the run's: never refused
PROCESS_DESTS = frozenset({"help", "threads", "log_level", "device", "recipe", "out", "no_progress"})
#: the namespace entry where :func:`add_sampling_options` lists the parser's other options (dest, flag, default)
OTHER_OPTIONS = "sampling_other_options"
# the old scripts' option names (scripts/walk_true_model.py, scripts/walk_learned_model.py), kept there as aliases
LEGACY_NAMES = {"explore_std": "--explore", "learned_model": "--model", "hybrid_kernel": "--kernel",
                "hybrid_linear_inputs": "--linear-inputs", "hybrid_space": "--space", "learned_window": "--window",
                "hybrid_noise": "--noise"}
SAMPLES = Number(int, 2)  # a sampling planner compares at least two sequences


def seed_list(text: str) -> list[int]:
    """``"5, 6,7"`` -> ``[5, 6, 7]``, each a seed (an argparse ``type``)."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"'{text}': expected comma-separated seeds")
    return [SEED(s) for s in items]


def parse_changes(text: str) -> list[str]:
    """``"weak_motor:0.3,weak_motor:0.1,torso_mass"`` -> its entries, each change with its own factor (a bare
    name: the change's default factor); InputError on a malformed item."""
    from gpdyn.experiments.walk_learned_model import split_change

    names = [item for item in (s.strip() for s in text.split(",")) if item]
    for item in names:
        split_change(item, "--changes")
    if not names:
        raise InputError("--changes: name at least one plant change (or none)")
    return names


def add_sampling_options(p: argparse.ArgumentParser, *, kinds: tuple[str, ...] = SAMPLING_KINDS, shared: bool = False,
                         legacy: bool = False) -> None:
    """The options of the ``kinds`` recipes that the walker's command lacks, as one argument group of ``p``.

    ``shared``: also those it has (``--recipe``, ``--steps``, ``--samples``, ``--horizon``,
    ``--controllers``, ``--out``), for a parser of these recipes alone; ``legacy``: the old scripts'
    option names beside the new ones, and ``--no-progress`` (the command's ``--quiet`` hides progress)."""
    learned = "walker-learned" in kinds
    ours = {d for dests in KIND_OPTIONS.values() for d in dests}
    # the options the parser has so far (the walker's own, when called after them): refused with these recipes
    others = tuple((a.dest, a.option_strings[-1], a.default) for a in p._actions
                   if a.option_strings and a.dest not in ours | PROCESS_DESTS)
    p.set_defaults(**{OTHER_OPTIONS: others})
    group = p.add_argument_group("predictive-sampling recipes (walker-sampling, walker-learned)",
                                 "with a recipe of these kinds --steps, --samples, --horizon and --controllers set "
                                 "its episodes and sampler, their default the recipe's")

    def option(dest: str, *names: str, **kw: Any) -> None:
        old = (LEGACY_NAMES[dest],) if legacy and dest in LEGACY_NAMES else ()
        group.add_argument(*names, *old, dest=dest, default=None, **kw)

    if shared:
        option("recipe", "--recipe", metavar="NAME|FILE.toml",
               help=f"a recipe of kind {' or '.join(kinds)}, a shipped name or a TOML file")
        option("steps", "--steps", type=COUNT, metavar="N", help="control steps per episode (default: the recipe's)")
        option("samples", "--samples", type=SAMPLES, metavar="K", help="sampled spline sequences per plan "
                                                                       "(default: the recipe's)")
        option("horizon", "--horizon", type=COUNT, metavar="H", help="planning steps (default: the recipe's)")
        if learned:
            option("controllers", "--controllers", metavar="A,B,...",
                   help="comma-separated, of true, frozen, online (default: the recipe's)")
        option("out", "--out", help="run folder (default logs/<job>-<time>)")
    option("seeds", "--seeds", type=seed_list, metavar="A,B,...",
           help="comma-separated episode seeds, one episode each (default: the recipe's)")
    if not learned:
        return
    option("changes", "--changes", metavar="CHANGE[:FACTOR],...",
           help="walker-learned: the plant changes, one run of every seed and controller each, a name of the "
                "task's plant_changes or none for the nominal plant (default: the recipe's)")
    option("explore_std", "--explore-std", type=NON_NEGATIVE, metavar="STD",
           help="walker-learned: action noise while learning online (default: the recipe's)")
    option("learned_model", "--learned-model", choices=LEARNED_MODELS,
           help="walker-learned: what the online model learns, the plant's physical parameters (parameters), a "
                "GP residual on the nominal model (residual) or a GP residual on the identified parameters "
                "(parameters+residual; default: the recipe's)")
    option("hybrid_kernel", "--hybrid-kernel", choices=("se", "linear"),
           help="walker-learned, --learned-model residual: the residual GP's kernel (default: the recipe's)")
    option("hybrid_learner", "--hybrid-learner", metavar="NAME",
           help="walker-learned, --learned-model residual: the residual's learner, residual (the ResidualGP of "
                "--hybrid-kernel) or a registered online learner such as wiski or svdgp, which needs --hybrid-space "
                "velocity (default: the recipe's)")
    option("hybrid_linear_inputs", "--hybrid-linear-inputs", choices=("all", "action"),
           help="walker-learned, --hybrid-kernel linear: over all inputs or the action alone (default: the recipe's)")
    option("hybrid_space", "--hybrid-space", choices=("velocity", "force"),
           help="walker-learned: the residual as a velocity change or a generalized force (default: the recipe's)")
    option("hybrid_noise", "--hybrid-noise", type=POSITIVE, metavar="VAR",
           help="walker-learned: the residual GP's noise variance, scaled targets (default: the recipe's)")
    option("learned_window", "--learned-window", type=COUNT, metavar="N",
           help="walker-learned: transitions the learned model conditions on (default: the recipe's)")
    option("eval_every", "--eval-every", type=NON_NEGATIVE_INT, metavar="N",
           help="walker-learned: steps between checks of the online model, 0 for none (default: the recipe's)")
    option("combine", "--combine", metavar="RUN[@NAME],...",
           help="walker-learned: print one table of these finished run folders (@NAME renames a folder's online "
                "controller) and run nothing")
    if legacy:
        group.add_argument("--no-progress", action="store_true", help="no progress bars")


def is_sampling_recipe(name: str) -> bool:
    """Whether recipe ``name`` (a shipped name or a TOML file) is a ``walker-sampling`` or ``walker-learned`` one;
    reads its file alone (no torch)."""
    from gpdyn.recipes import read_recipe

    return read_recipe(name).robot in SAMPLING_KINDS


def run_sampling_recipe(recipe: Any, args: argparse.Namespace) -> int:
    """Run ``recipe`` (a :class:`~gpdyn.recipes.Recipe`, or its name or file) of kind ``walker-sampling`` or
    ``walker-learned`` with the options in ``args`` over its values (module docs); returns the exit status.

    InputError, before any run folder is made, for a recipe of another kind, a bad value, or an option of
    ``args`` that the recipe's kind does not take."""
    from gpdyn.recipes import load_recipe

    if isinstance(recipe, str):
        recipe = load_recipe(recipe)
    if recipe.robot not in SAMPLING_KINDS:
        raise InputError(f"recipe {recipe.name}: a '{recipe.robot}' recipe, not one of {', '.join(SAMPLING_KINDS)}")
    given = _given(recipe.robot, args)
    command = f"gpdyn control walker: recipe {recipe.name}"
    if recipe.robot == "walker-sampling":
        folder = _run_true_model(recipe, given, args, command)
    elif given.get("combine"):
        from gpdyn.experiments.walk_learned_model import combine

        print(combine([s.strip() for s in given["combine"].split(",") if s.strip()]))
        return 0
    else:
        folder = _run_learned_model(recipe, given, args, command)
    recipe.write_summary(folder, given)
    return 0


def _given(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """The options of ``kind`` given in ``args``; InputError naming the first other option given: one of the
    parser's own (the legged run's, listed by :func:`add_sampling_options`) or of the other kind."""
    takes = KIND_OPTIONS[kind]
    refused = [f"--{dest.replace('_', '-')}" for dest in sorted({d for ds in KIND_OPTIONS.values() for d in ds} - set(takes))
               if getattr(args, dest, None) is not None]
    refused += [flag for dest, flag, default in getattr(args, OTHER_OPTIONS, ()) if getattr(args, dest, default) != default]
    if refused:
        raise InputError(f"{refused[0]} does not apply to a {kind} recipe (the spline sampler's); its options are "
                         f"{', '.join('--' + d.replace('_', '-') for d in takes)}")
    device = str(getattr(args, "device", None) or "cpu")
    if not device.startswith("cpu"):
        raise InputError(f"--device {device}: a {kind} recipe plans on the CPU (MuJoCo rollouts in numpy)")
    return {dest: getattr(args, dest) for dest in takes if getattr(args, dest, None) is not None}


def _run_true_model(recipe: Any, given: dict[str, Any], args: argparse.Namespace, command: str) -> Any:
    from gpdyn.experiments.walk_true_model import run
    from gpdyn.recipes import WalkRun

    sampler = dataclasses.replace(recipe.build("sampler"), **{k: given[k] for k in ("samples", "horizon") if k in given})
    episodes = recipe.build("run")
    episodes = WalkRun(seeds=tuple(given.get("seeds", episodes.seeds)), steps=given.get("steps", episodes.steps))
    episodes.validate()
    print(command)
    return run(list(episodes.seeds), episodes.steps, sampler, recipe.build("cost"), out=args.out,
               progress=not getattr(args, "no_progress", False))


def _run_learned_model(recipe: Any, given: dict[str, Any], args: argparse.Namespace, command: str) -> Any:
    from gpdyn.experiments.walk_learned_model import run

    residual = dataclasses.replace(recipe.build("residual"), **{field: given[dest] for dest, field in (
        ("hybrid_kernel", "kernel"), ("hybrid_learner", "learner"), ("hybrid_space", "space"), ("hybrid_linear_inputs", "linear_inputs"),
        ("learned_window", "window"), ("hybrid_noise", "noise")) if dest in given})
    sampler = dataclasses.replace(recipe.build("sampler"), **{k: given[k] for k in ("samples", "horizon") if k in given})
    config = recipe.build("run", sampler=sampler, residual=residual, identification=recipe.build("identification"))
    if "learned_window" in given:  # both learned models condition on a window of recent transitions
        config.identification.window = given["learned_window"]
    if "changes" in given:
        config.changes, config.factors = parse_changes(given["changes"]), {}  # the command line's factors alone
    if "controllers" in given:
        names = given["controllers"]  # comma-separated text, or the list the walker's option makes of it
        config.controllers = [c.strip() for c in (names.split(",") if isinstance(names, str) else names) if c.strip()]
    for dest, field in (("learned_model", "model"), ("seeds", "seeds"), ("steps", "steps"), ("explore_std", "explore_std"),
                        ("eval_every", "eval_every")):
        if dest in given:
            setattr(config, field, given[dest])
    print(command)
    return run(config, recipe.build("cost"), out=args.out, progress=not getattr(args, "no_progress", False))


__all__ = ["KIND_OPTIONS", "LEARNED_MODELS", "OTHER_OPTIONS", "SAMPLING_KINDS", "add_sampling_options", "is_sampling_recipe",
           "parse_changes", "run_sampling_recipe", "seed_list"]
