"""``stagefate replay``: a trace through the continuous-batching engine, one run per policy."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from ..output_files import distinct_outputs, held_outputs
from ..registry import policy_factories
from ..sim.costs import DEFAULT_PRESET, PRESETS
from ..sim.instances import ROUTERS
from ..sim.replay import DEFAULT_SPEED, ReplayOptions, replay_config
from ..sim.trace import TraceRequest
from .common import (
    add_sglang_env,
    console,
    output_file,
    parse_sglang_env,
    positive,
    positive_int,
)
from .model_options import add_field_flag
from .replay_modes import (
    FIELD_FLAGS,
    Report,
    behind_the_router,
    one_run,
    over_seeds,
    replay_options,
    sweep,
)

DEFAULT_UTILIZATION = 0.9
"""--speed auto's target: the share of time the engine is busy."""


def add_parser(sub: Any) -> None:
    replay = sub.add_parser(
        "replay", help="replay a Mooncake trace through the pipeline: live tree vs blind gamble"
    )
    replay.add_argument("--trace", help="Mooncake-format .jsonl (default: the embedded slice)")
    replay.add_argument(
        "--limit", type=positive_int("requests to replay"), help="replay only the first N requests"
    )
    replay.add_argument(
        "--policy",
        default="all",
        help="comma-separated: live, blind, sglang (the newest SGLang installed) or sglang==V "
        "(one release, `stagefate targets`); all (default): live, blind, and sglang where one "
        "is installed (with --releases: each of them)",
    )
    replay.add_argument(
        "--releases",
        help="--policy all: SGLang's releases to run beside live and blind, e.g. 0.5.19,0.5.23",
    )
    add_sglang_env(replay, "its SGLang runs")
    replay.add_argument(
        "--speed",
        type=_speed,
        help="arrival speed (timestamps divided by it), or auto: the speed at which the engine "
        f"is busy --utilization of the time (default: auto with --trace; {DEFAULT_SPEED} on "
        "the embedded slice, where one H200 carries about a third of its rate, docs/replay.md)",
    )
    replay.add_argument(
        "--utilization",
        type=_utilization,
        help="--speed auto: the share of time the engine should be busy, in (0, 1] (default "
        f"{DEFAULT_UTILIZATION})",
    )
    replay.add_argument(
        "--sweep",
        help="run every policy at each speed, e.g. 0.5,1,2,4; a speed ending in a is a "
        "multiple of --speed auto's busy load (0.5a,1a,2a); auto: five loads from the busy one "
        "to twice the load where the designs part",
    )
    replay.add_argument("--model", choices=sorted(PRESETS), default=DEFAULT_PRESET)
    replay.add_argument("--costs", help="YAML/JSON file of cost-model fields to override")
    for field_flag in FIELD_FLAGS.values():
        add_field_flag(replay, field_flag)
    replay.add_argument(
        "--seeds",
        help="replay each policy once per IO-jitter seed and report median [min–max]: a count N "
        "(seeds --seed … --seed+N-1) or a list like 0,1,2",
    )
    replay.add_argument(
        "--jobs",
        type=positive_int("processes for --seeds and --sweep"),
        help="processes --seeds and --sweep run their replays in (default: the cores)",
    )
    replay.add_argument(
        "--no-dedup", action="store_true", help="live: read spans a sibling is already reading"
    )
    replay.add_argument(
        "--arrivals",
        choices=["open", "causal"],
        help="open: each request at its trace time; causal: a conversation's turn (inferred "
        "from the hash chains) after the turn it follows has finished (default: causal where "
        "the trace has turns, docs/replay.md)",
    )
    replay.add_argument(
        "--instances",
        type=positive_int("engine instances"),
        default=1,
        help="N engines on one clock, each its own tree, pools and pipeline, sharing one L3 "
        "behind --router (default 1)",
    )
    replay.add_argument(
        "--router",
        choices=ROUTERS,
        help="--instances: where each request goes (default cache_aware: SGLang's router, "
        "docs/replay.md)",
    )
    replay.add_argument(
        "--json", type=output_file("the JSON"), help="write {policy: metrics} to this file"
    )
    replay.add_argument(
        "--log",
        type=output_file("the transition log"),
        help="write the live run's transition log (JSON lines) here; with --tp N one per rank, "
        "PATH's name with .rank0 … before its suffix; each SGLang policy's, in its design's "
        "words, beside it (live.sglang.jsonl, live.sglang-0.5.19.jsonl)",
    )
    replay.add_argument(
        "--plot",
        type=output_file("the plot", ".png"),
        help="write a PNG comparing the policies (needs matplotlib)",
    )
    replay.set_defaults(func=run)


MAX_POOL_TOKENS = 1 << 28
"""The largest device or host pool a replay takes: 268 M tokens, past any GPU's KV (an H200
holds about 1 M tokens of Llama-3.1-8B's). The simulated pools are real tensors of 4 bytes a
token, so a larger one would fail inside torch's allocator, or take the machine's memory."""


def _check_pools(args: argparse.Namespace) -> None:
    """Refuse, before any work, pools no machine has and a step that cannot hold one page (the
    engine admits in whole pages: it would wait for ever)."""
    for flag, tokens in (
        ("--device-tokens", args.device_tokens),
        ("--host-tokens", args.host_tokens),
    ):
        if tokens is not None and tokens > MAX_POOL_TOKENS:
            raise ValueError(
                f"{flag} {tokens:,} is more than any machine's KV ({MAX_POOL_TOKENS:,} tokens at "
                f"most; the pool is allocated for real): pass a smaller {flag}"
            )
    page = args.page_size
    if args.host_tokens is not None and args.host_tokens < max(page, args.prefetch_threshold):
        least, why = (
            (page, f"below one page ({page:,} tokens, --page-size): it could stage nothing")
            if args.host_tokens < page
            else (
                args.prefetch_threshold,
                f"below --prefetch-threshold {args.prefetch_threshold:,}: it could stage no span "
                "long enough to fetch",
            )
        )
        raise ValueError(
            f"--host-tokens {args.host_tokens:,} is {why}, so every L3 hit would be declined; "
            f"pass --host-tokens {least} or more"
        )
    for flag, tokens in (
        ("--max-prefill-tokens", args.max_prefill_tokens),
        ("--chunked-prefill-size", args.chunked_prefill_size),
    ):
        if tokens < page:
            raise ValueError(
                f"{flag} {tokens:,} is below one page ({page:,} tokens, --page-size): no prompt "
                f"could be admitted; pass {flag} {page} or more, or a smaller --page-size"
            )


def _choose_arrivals(args: argparse.Namespace, trace: list[TraceRequest]) -> None:
    """``--arrivals``, by default causal where the trace's hash chains hold turns."""
    from ..sim.conversations import infer_turns

    turns = infer_turns(trace)
    if args.arrivals is None:
        args.arrivals = turns.default_arrivals
    if turns.predecessor or turns.shared_prefixes:
        console.print(
            f"arrivals {args.arrivals}: {len(turns.predecessor):,} turns of "
            f"{turns.conversations:,} conversations follow an earlier turn "
            f"({turns.whole_prompt:,} extend its whole prompt, "
            f"{len(turns.less_partial_block):,} its prompt less a partial last block; "
            f"{turns.shared_prefixes:,} prefixes several requests extend or share are no turns)"
            + ("; each waits for the turn before" if args.arrivals == "causal" else "")
        )


MIN_SPEED = 1e-3
"""The slowest arrival speed taken: slower, a second of the trace lasts past a quarter hour and
the engine only idles between arrivals (1e-300 once reported 1.4e291 s of engine time)."""


def _speed(text: str) -> float | str:
    """``--speed``: ``auto`` or a number of at least :data:`MIN_SPEED`."""
    if text == "auto":
        return "auto"
    speed = positive("arrival speed; 2 = arrivals twice as fast")(text)
    if speed < MIN_SPEED:
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_SPEED:g} (slower, the engine only idles between arrivals); "
            f"got {text}"
        )
    return speed


def _utilization(text: str) -> float:
    share = positive("share of time the engine is busy")(text)
    if share > 1:
        raise argparse.ArgumentTypeError(
            f"must lie in (0, 1] (the share of time the engine is busy, e.g. 0.9); got {text}"
        )
    return share


def _check_combinations(args: argparse.Namespace, sweep: list[tuple[float, bool]]) -> None:
    """Refuse flags that the rest of the command line leaves without effect (a user who gave
    them meant something the run would not do)."""
    if sweep and args.speed not in (None, "auto"):
        raise ValueError(
            "--sweep sets the speeds (one ending in a is a multiple of --speed auto's): drop "
            f"--speed {args.speed}, or --sweep"
        )
    searched = _auto_speed(args, sweep) or any(relative for _speed, relative in sweep)
    if args.utilization is not None and not searched:
        raise ValueError(
            "--utilization is --speed auto's target: add --speed auto (or a sweep like 1a,2a), "
            "or drop --utilization"
        )
    if args.router is not None and args.instances == 1:
        raise ValueError("--router routes among --instances: add --instances 2 (or more)")


def _parse_speeds(text: str) -> list[tuple[float, bool]]:
    """``--sweep``: ``(speed, relative)`` pairs; a relative one is a multiple of auto's;
    ``auto``: :data:`AUTO_SWEEP`."""
    if text.strip() == "auto":
        return AUTO_SWEEP
    fix = "e.g. 0.5,1,2,4 or 0.5a,1a,2a (multiples of --speed auto's), or auto"
    speeds = []
    for part in (part.strip() for part in text.split(",")):
        if not part:
            continue
        relative = part.endswith("a")
        try:
            speeds.append((float(part.removesuffix("a")), relative))
        except ValueError:
            raise ValueError(f"--sweep takes speeds {fix}; got {text!r}") from None
    if not speeds or any(not MIN_SPEED <= speed < math.inf for speed, _relative in speeds):
        raise ValueError(
            f"--sweep takes finite speeds of at least {MIN_SPEED:g}, {fix}; got {text!r}"
        )
    return speeds


def _resolve_speeds(
    args: argparse.Namespace, trace: list[TraceRequest], sweep: list[tuple[float, bool]]
) -> list[float]:
    """``args.speed`` made a number (searched for when auto, and by default with ``--trace``
    and no ``--sweep``) and the sweep's speeds with it, in order."""
    from ..sim.load_search import find_speed

    auto = _auto_speed(args, sweep)
    if not auto and not any(relative for _speed, relative in sweep):
        args.speed = args.speed or DEFAULT_SPEED
        return sorted({speed for speed, _relative in sweep})
    options = replay_options(args, DEFAULT_SPEED).model_copy(update={"tp_size": 1})
    target = DEFAULT_UTILIZATION if args.utilization is None else args.utilization
    search = find_speed(policy_factories(["live"])["live"], trace, options, target)
    console.print(
        f"--speed auto: {search.speed:.3g}x keeps the engine busy {search.busy_fraction:.3f} "
        f"of the time (target {search.utilization:g}) over the first {search.requests:,} "
        f"requests; {search.evaluations} replays of them in {search.seconds:.1f} s"
        + ("" if search.reached else "; the fastest speed tried stays below the target")
    )
    busy, parting = search.speed, search.speed
    if auto or sweep == AUTO_SWEEP:
        parting = _parting_speed(trace, options, search.speed)
    if sweep == AUTO_SWEEP:  # from the busy load to twice the parting one, evenly in log space
        ratio = (2 * parting / busy) ** (1 / (AUTO_SWEEP_SPEEDS - 1))
        return sorted({_three_digits(busy * ratio**step) for step in range(AUTO_SWEEP_SPEEDS)})
    if auto:
        args.speed = _three_digits(parting * args.instances)
        if args.instances > 1:  # each engine then carries what one carries at the auto speed
            console.print(f"{args.instances} instances: {args.speed:g}x")
    args.speed = args.speed or DEFAULT_SPEED
    return sorted({_three_digits(speed * (busy if relative else 1)) for speed, relative in sweep})


AUTO_SWEEP = [(0.0, True)]
"""``--sweep auto`` as parsed: the busy load to twice the parting load (:func:`_parting_speed`)."""
AUTO_SWEEP_SPEEDS = 5


def _parting_speed(trace: list[TraceRequest], options: ReplayOptions, busy: float) -> float:
    """From the busy load ``busy``, the load at which live or blind first misses the trace's
    bound (:func:`~stagefate.sim.load_search.find_parting_speed`), said with both loads."""
    from ..sim.load_search import PARTED_SHARE, find_parting_speed

    found = find_parting_speed(policy_factories(["live", "blind"]), trace, options, busy)

    def shares(at: dict[str, float]) -> str:
        return ", ".join(f"{name} {share:.3f}" for name, share in at.items())

    if not found.shares:
        console.print("the trace reuses nothing: every load leaves nothing to decide")
    elif found.speed == busy:
        console.print(
            f"at {busy:.3g}x the designs already part ({shares(found.shares)} of the bound)"
        )
    else:
        console.print(
            f"at {busy:.3g}x every design reaches the bound ({shares(found.busy_shares)} of it): "
            + (
                f"they part at {found.speed:.3g}x ({shares(found.shares)}; below "
                f"{PARTED_SHARE} of the bound is a miss), found in {found.evaluations} replays "
                f"of each in {found.seconds:.1f} s; replaying there"
                if found.parted
                else f"they still do at {found.speed:.3g}x, the fastest tried; replaying there"
            ),
            soft_wrap=True,
        )
    return found.speed


def _auto_speed(args: argparse.Namespace, sweep: list[tuple[float, bool]]) -> bool:
    """Whether ``--speed`` is searched for: asked (auto), or by default with ``--trace`` and
    no ``--sweep``."""
    return args.speed == "auto" or (args.speed is None and args.trace is not None and not sweep)


def _three_digits(speed: float) -> float:
    """A searched speed to three significant digits: what the report prints and advises is a
    speed a user can type back (1.02, not 1.01544)."""
    return float(f"{speed:.3g}")


def _policies(choice: str, storage: str, releases: str | None, tp: int = 1) -> list[str]:
    """``--policy``: a comma-separated list, or all: live, blind and SGLang where installed
    (each of ``--releases``; else the newest, or a hint naming the install); with ``--tp``
    above one, live alone."""
    from ..registry import policies_for_all

    names = [name.strip() for name in choice.split(",") if name.strip()]
    if tp > 1 and names not in (["live"], ["all"]):
        raise ValueError(
            f"--tp {tp} replays the live pipeline as {tp} ranks; blind (outside the lifecycle) "
            "and SGLang's pipeline run as one rank: pass --policy live, or drop --tp"
        )
    if tp > 1:
        if names == ["all"]:
            console.print(f"--policy all with --tp {tp}: live only (the pipeline run as ranks)")
        return ["live"]
    if not names or len(set(names)) != len(names):
        raise ValueError(
            f"--policy {choice!r}: name each policy once, e.g. live,blind,sglang==0.5.19, or all"
        )
    versions = [part.strip() for part in (releases or "").split(",") if part.strip()]
    if releases is not None and names != ["all"]:
        raise ValueError(
            "--releases picks SGLang's releases for --policy all; name them in "
            "--policy instead (sglang==V)"
        )
    if names != ["all"]:
        if "all" in names:
            raise ValueError("--policy all stands alone; or list the policies (live,blind,…)")
        return names
    policies, left_out = policies_for_all(storage, versions)
    if left_out is not None:
        console.print(f"--policy all: live and blind only ({left_out})")
    return policies


def sglang_releases(policies: list[str], tree: str) -> dict[str, str]:
    """The SGLang release each ``sglang`` policy runs, by policy name."""
    from ..registry import target_for

    found = {}
    for name in policies:
        target = target_for(name, tree)
        if target is not None and name.partition("==")[0] == "sglang":
            found[name] = target.version
    return found


def run(args: argparse.Namespace) -> int:
    """Check the flags, load the trace, then run the mode they ask for (one function each in
    :mod:`.replay_modes`)."""
    from ..sim.trace import load_trace, out_of_order

    asked = [] if args.sweep is None else _parse_speeds(args.sweep)
    distinct_outputs([("--json", args.json), ("--log", args.log), ("--plot", args.plot)])
    _check_combinations(args, asked)
    seeds = [args.seed] if args.seeds is None else parse_seeds(args.seeds, args.seed)
    if len(seeds) > 1 and args.log:
        raise ValueError("--log records one run's transitions: drop --seeds or --log")
    if len(seeds) > 1 and args.plot and not asked:
        raise ValueError(
            "--plot with --seeds draws the sweep's median lines and bands: add --sweep, or drop "
            "--plot (the table shows median [min–max])"
        )
    args.seed = seeds[0]  # one seed is today's single run under that seed
    _check_pools(args)
    trace = load_trace(args.trace, args.limit)
    replay_config(replay_options(args, DEFAULT_SPEED), trace)  # a pool too small: refused now
    _choose_arrivals(args, trace)
    policies = _policies(args.policy, args.storage, args.releases, args.tp)
    sglang_env = parse_sglang_env(args.sglang_env)
    releases = sglang_releases(policies, args.tree)  # an uninstalled release is refused here
    if sglang_env:
        from ..registry import target_for
        from ..targets.sglang.environments import check_knobs

        used = [target_for(policy, args.tree) for policy in policies]
        check_knobs(sglang_env, [target for target in used if target is not None])
    if args.instances > 1:
        _check_instances(args, policies, seeds, asked)
    if args.log and (asked or ("live" not in policies and not releases)):
        raise ValueError(
            "--log records the live pipeline's transitions (and SGLang's, in its design's words) "
            "in one run: use it without --sweep, with --policy live, sglang, sglang==V or all"
        )
    speeds = _resolve_speeds(args, trace, asked) or None
    source = args.trace or "the embedded Mooncake slice"
    first = replay_options(args, speeds[0] if speeds else args.speed)
    costs = first.costs
    console.print(
        f"replaying {len(trace):,} requests of {source} on {costs.model}, {costs.gpu} "
        f"({first.device_tokens or costs.device_kv_tokens():,} device KV tokens), "
        f"prefetch policy {first.engine.prefetch_policy}, {first.engine.schedule}"
        + (f", {args.tp} tensor-parallel ranks" if args.tp > 1 else "")
    )
    moved = out_of_order(trace)
    if moved:
        console.print(
            f"note: {source} is not in time order ({moved:,} of the {len(trace):,} requests "
            "replayed are not at their arrival rank in the file); replayed in timestamp order"
            + (f" (--limit {args.limit} took the earliest arrivals)" if args.limit else "")
        )
    with held_outputs([args.json, args.plot]):  # the log holds its own
        return _run_mode(args, trace, policies, seeds, speeds, first, releases, sglang_env)


def _run_mode(
    args: argparse.Namespace,
    trace: list[TraceRequest],
    policies: list[str],
    seeds: list[int],
    speeds: list[float] | None,
    first: ReplayOptions,
    releases: dict[str, str],
    sglang_env: dict[str, str],
) -> int:
    from ..sim.bound import hit_rate_bound
    from ..sim.report_json import RunDescription

    source = args.trace or "the embedded Mooncake slice"
    arrival_ms = trace[-1].timestamp_ms - trace[0].timestamp_ms
    bound = hit_rate_bound(trace, args.page_size, _stored(trace, args))
    report = Report(args, bound, RunDescription.of(source, trace, _arguments(args), first))
    if args.instances > 1:
        return behind_the_router(args, trace, policies, first, report, arrival_ms, sglang_env)
    if len(seeds) > 1:
        return over_seeds(
            args, trace, policies, speeds or [args.speed], seeds, bool(speeds), sglang_env, report
        )
    if speeds:
        return sweep(args, trace, policies, speeds, sglang_env, report)
    return one_run(args, trace, policies, first, releases, sglang_env, report, arrival_ms)


def _stored(trace: list[TraceRequest], args: argparse.Namespace) -> dict[int, int] | None:
    """What a persistent L3 already holds of the trace's prompts (None: one that starts empty),
    so the bound counts it: a file L3 left by an earlier run serves pages no request wrote."""
    if args.storage == "memory":
        return None
    from ..runtime.pools import KVLayout
    from ..runtime.storage import HoldsConnections, open_storage
    from ..sim.bound import stored_pages

    storage = open_storage(args.storage, KVLayout(1, args.tp, 1), args.page_size)
    try:
        return stored_pages(trace, args.page_size, storage, args.tp)
    finally:
        if isinstance(storage, HoldsConnections):
            storage.close()  # the run's pipelines open their own


def _check_instances(
    args: argparse.Namespace, policies: list[str], seeds: list[int], asked: Sequence[object]
) -> None:
    """What ``--instances N`` runs with, refused before any work."""
    fix = f"--instances {args.instances}"
    for given, flag in (
        (args.tp > 1, "--tp"),
        (bool(args.log), "--log"),
        (bool(args.plot), "--plot"),
    ):
        if given:
            raise ValueError(f"{fix} does not combine with {flag} yet: drop one of them")
    if len(seeds) > 1 or asked:
        raise ValueError(f"{fix} replays one speed and one seed: drop --seeds and --sweep")


MAX_SEEDS = 1000
"""The most replays ``--seeds N`` asks for (a hundred million once started, silently)."""


def parse_seeds(text: str, first: int) -> list[int]:
    """``--seeds``: a count N (``first`` … ``first + N - 1``) or a list of distinct seeds."""
    fix = "pass a count of at least 1 (--seeds 3) or distinct seeds (--seeds 0,1,2)"
    parts = [part.strip() for part in text.split(",")]
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"--seeds {text!r} is not a count or a list of seeds: {fix}") from None
    if len(numbers) == 1:
        if numbers[0] < 1:
            raise ValueError(f"--seeds {text}: a count must be at least 1; {fix}")
        if numbers[0] > MAX_SEEDS:
            raise ValueError(
                f"--seeds {numbers[0]:,}: each seed is a whole replay of every policy (seconds to "
                f"minutes each); at most {MAX_SEEDS:,}, and a spread needs a handful (3 to 10)"
            )
        return list(range(first, first + numbers[0]))
    if any(n < 0 for n in numbers) or len(set(numbers)) != len(numbers):
        raise ValueError(f"--seeds {text!r}: seeds are distinct and not negative; {fix}")
    return numbers


def _arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed command line, for the JSON: every flag with its value (defaults included)."""
    return {name: value for name, value in vars(args).items() if not callable(value)}
