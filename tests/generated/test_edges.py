"""Written by `stagefate check --emit-tests tests/generated` from spec/lifecycle.yaml.

Do not edit: a spec change shows up here as a diff of tests. One test per modelled edge of the spec
(103 of 105; not modelled: the branches guarded by aux_cut), and one per overlap of two neighbouring
guards a program can meet (35, named ..__also__<guard>), each the model checker's shortest program
of public calls that takes it (spec/witnesses.py), on the model's world made of real objects
(stagefate.testing.LineWorld). After every step: the state the model predicts and the transitions
the step fired. At the end: every request let go, the pipeline quiescent.
"""

from __future__ import annotations

from stagefate.spec.model_world import Bounds
from stagefate.testing import LineWorld

BOUNDS = Bounds(
    pages=5,
    requests=3,
    host_pages=2,
    device_pages=4,
    cap_pages=2,
    threshold_pages=2,
    issues_per_request=2,
)


def test_issued__lock__below_threshold() -> None:
    """(issued) --lock--> released (declined_too_short)

    when below_threshold: the span is shorter than prefetch_threshold tokens
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(2, stale=True)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r2: (issued) --lock[below_threshold]--> released (declined_too_short)")
    world.finish()


def test_issued__lock__below_threshold__also__load_slower_than_compute() -> None:
    """(issued) --lock--> released (declined_too_short)

    when below_threshold: the span is shorter than prefetch_threshold tokens; while
    load_slower_than_compute held too: the speeds measured while serving say that loading the
    span (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(2, stale=True, loads_slower=True)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r2: (issued) --lock[below_threshold]--> released (declined_too_short)")
    world.finish()


def test_issued__lock__load_slower_than_compute() -> None:
    """(issued) --lock--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0, loads_slower=True)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (issued) --lock[load_slower_than_compute]--> released (declined_slower_than_compute)",
    )
    world.finish()


def test_issued__lock__load_slower_than_compute__also__root_prefix() -> None:
    """(issued) --lock--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured; while root_prefix held too: the matched prefix is empty, so the
    anchor is the root
    """
    world = LineWorld(BOUNDS)
    world.issue(0, loads_slower=True)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (issued) --lock[load_slower_than_compute]--> released (declined_slower_than_compute)",
    )
    world.finish()


def test_issued__lock__root_prefix() -> None:
    """(issued) --lock--> no_anchor

    when root_prefix: the matched prefix is empty, so the anchor is the root
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.finish()


def test_issued__lock__live_match_short() -> None:
    """(issued) --lock--> anchor_lost

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.finish()


def test_issued__lock__live_match_short__also__over_cap() -> None:
    """(issued) --lock--> anchor_lost

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len; while over_cap held too: pinning the anchor would push prefetch-pinned tokens
    over the cap
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1, stale=True)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.finish()


def test_issued__lock__over_cap() -> None:
    """(issued) --lock--> cap_skip

    when over_cap: pinning the anchor would push prefetch-pinned tokens over the cap
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.finish()


def test_issued__lock__else() -> None:
    """(issued) --lock--> locked

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.finish()


def test_locked__lock__else() -> None:
    """(locked) --lock--> locked

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.lock(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (locked) --lock[else]--> locked")
    world.finish()


def test_no_anchor__lock__else() -> None:
    """(no_anchor) --lock--> no_anchor

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.lock(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (no_anchor) --lock[else]--> no_anchor")
    world.finish()


def test_cap_skip__lock__live_match_short() -> None:
    """(cap_skip) --lock--> anchor_lost

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.publish()
    world.expect(device=2, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired()
    world.issue(1)
    world.expect(device=2, host_free=2, pinned=1, r0="locked", r1="cap_skip", r2=None)
    world.fired("r1: (issued) --lock[over_cap]--> cap_skip")
    world.evict()
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="cap_skip", r2=None)
    world.fired()
    world.lock(1)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="anchor_lost", r2=None)
    world.fired("r1: (cap_skip) --lock[live_match_short]--> anchor_lost")
    world.finish()


def test_cap_skip__lock__live_match_short__also__over_cap() -> None:
    """(cap_skip) --lock--> anchor_lost

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len; while over_cap held too: pinning the anchor would push prefetch-pinned tokens
    over the cap
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.publish()
    world.expect(device=2, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired()
    world.issue(1)
    world.expect(device=2, host_free=2, pinned=1, r0="locked", r1="cap_skip", r2=None)
    world.fired("r1: (issued) --lock[over_cap]--> cap_skip")
    world.evict()
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="cap_skip", r2=None)
    world.fired()
    world.lock(1)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="anchor_lost", r2=None)
    world.fired("r1: (cap_skip) --lock[live_match_short]--> anchor_lost")
    world.finish()


def test_cap_skip__lock__over_cap() -> None:
    """(cap_skip) --lock--> cap_skip

    when over_cap: pinning the anchor would push prefetch-pinned tokens over the cap
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.lock(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (cap_skip) --lock[over_cap]--> cap_skip")
    world.finish()


def test_cap_skip__lock__else() -> None:
    """(cap_skip) --lock--> locked

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.abort(0)
    world.expect(device=1, host_free=2, pinned=1, r0=None, r1="locked", r2="cap_skip")
    world.fired("r0: (locked) --abort[else]--> released (aborted)")
    world.lock(2)
    world.expect(device=1, host_free=2, pinned=2, r0=None, r1="locked", r2="locked")
    world.fired("r2: (cap_skip) --lock[else]--> locked")
    world.finish()


def test_anchor_lost__lock__live_match_short() -> None:
    """(anchor_lost) --lock--> anchor_lost

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.lock(0)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (anchor_lost) --lock[live_match_short]--> anchor_lost")
    world.finish()


def test_anchor_lost__lock__live_match_short__also__over_cap() -> None:
    """(anchor_lost) --lock--> anchor_lost

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len; while over_cap held too: pinning the anchor would push prefetch-pinned tokens
    over the cap
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1, stale=True)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.lock(1)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="anchor_lost", r2=None)
    world.fired("r1: (anchor_lost) --lock[live_match_short]--> anchor_lost")
    world.finish()


def test_anchor_lost__lock__over_cap() -> None:
    """(anchor_lost) --lock--> cap_skip

    when over_cap: pinning the anchor would push prefetch-pinned tokens over the cap
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=1, r0="anchor_lost", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="anchor_lost", r1="locked", r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.lock(0)
    world.expect(device=1, host_free=2, pinned=2, r0="cap_skip", r1="locked", r2="locked")
    world.fired("r0: (anchor_lost) --lock[over_cap]--> cap_skip")
    world.finish()


def test_anchor_lost__lock__else() -> None:
    """(anchor_lost) --lock--> locked

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.lock(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (anchor_lost) --lock[else]--> locked")
    world.finish()


def test_locked__hit__zero_pages() -> None:
    """(locked) --hit--> released (revoked_full_miss)

    when zero_pages: storage has no page of the span
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.complete(0, "error")
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (locked) --hit[zero_pages]--> released (revoked_full_miss)")
    world.finish()


def test_locked__hit__zero_pages__also__hit_below_threshold() -> None:
    """(locked) --hit--> released (revoked_full_miss)

    when zero_pages: storage has no page of the span; while hit_below_threshold held too: pages
    found times page_size is below prefetch_threshold
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.complete(0, "error")
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (locked) --hit[zero_pages]--> released (revoked_full_miss)")
    world.finish()


def test_locked__hit__hit_below_threshold() -> None:
    """(locked) --hit--> released (revoked_insufficient)

    when hit_below_threshold: pages found times page_size is below prefetch_threshold
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.complete(0, "short", pages=1)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (locked) --hit[hit_below_threshold]--> released (revoked_insufficient)")
    world.finish()


def test_locked__hit__else() -> None:
    """(locked) --hit--> locked

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.complete(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (locked) --hit[else]--> locked",
        "r0: (locked) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_no_anchor__hit__zero_pages() -> None:
    """(no_anchor) --hit--> released (revoked_full_miss)

    when zero_pages: storage has no page of the span
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "error")
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (no_anchor) --hit[zero_pages]--> released (revoked_full_miss)")
    world.finish()


def test_no_anchor__hit__zero_pages__also__hit_below_threshold() -> None:
    """(no_anchor) --hit--> released (revoked_full_miss)

    when zero_pages: storage has no page of the span; while hit_below_threshold held too: pages
    found times page_size is below prefetch_threshold
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "error")
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (no_anchor) --hit[zero_pages]--> released (revoked_full_miss)")
    world.finish()


def test_no_anchor__hit__hit_below_threshold() -> None:
    """(no_anchor) --hit--> released (revoked_insufficient)

    when hit_below_threshold: pages found times page_size is below prefetch_threshold
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=1)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (no_anchor) --hit[hit_below_threshold]--> released (revoked_insufficient)")
    world.finish()


def test_no_anchor__hit__else() -> None:
    """(no_anchor) --hit--> no_anchor

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_cap_skip__hit__zero_pages() -> None:
    """(cap_skip) --hit--> released (revoked_full_miss)

    when zero_pages: storage has no page of the span
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.complete(2, "error")
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r2: (cap_skip) --hit[zero_pages]--> released (revoked_full_miss)")
    world.finish()


def test_cap_skip__hit__zero_pages__also__hit_below_threshold() -> None:
    """(cap_skip) --hit--> released (revoked_full_miss)

    when zero_pages: storage has no page of the span; while hit_below_threshold held too: pages
    found times page_size is below prefetch_threshold
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.complete(2, "error")
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r2: (cap_skip) --hit[zero_pages]--> released (revoked_full_miss)")
    world.finish()


def test_cap_skip__hit__hit_below_threshold() -> None:
    """(cap_skip) --hit--> released (revoked_insufficient)

    when hit_below_threshold: pages found times page_size is below prefetch_threshold
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.complete(2, "short", pages=1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r2: (cap_skip) --hit[hit_below_threshold]--> released (revoked_insufficient)")
    world.finish()


def test_cap_skip__hit__else() -> None:
    """(cap_skip) --hit--> cap_skip

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=2, r0="locked", r1="locked", r2="reading")
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r2: (cap_skip) --commit[else]--> reading",
    )
    world.finish()


def test_anchor_lost__hit__zero_pages() -> None:
    """(anchor_lost) --hit--> released (revoked_full_miss)

    when zero_pages: storage has no page of the span
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.complete(0, "error")
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (anchor_lost) --hit[zero_pages]--> released (revoked_full_miss)")
    world.finish()


def test_anchor_lost__hit__zero_pages__also__hit_below_threshold() -> None:
    """(anchor_lost) --hit--> released (revoked_full_miss)

    when zero_pages: storage has no page of the span; while hit_below_threshold held too: pages
    found times page_size is below prefetch_threshold
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.complete(0, "error")
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (anchor_lost) --hit[zero_pages]--> released (revoked_full_miss)")
    world.finish()


def test_anchor_lost__hit__hit_below_threshold() -> None:
    """(anchor_lost) --hit--> released (revoked_insufficient)

    when hit_below_threshold: pages found times page_size is below prefetch_threshold
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.complete(0, "short", pages=1)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (anchor_lost) --hit[hit_below_threshold]--> released (revoked_insufficient)")
    world.finish()


def test_anchor_lost__hit__else() -> None:
    """(anchor_lost) --hit--> anchor_lost

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.complete(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[live_match_short]--> released (declined_anchor_lost)",
    )
    world.finish()


def test_cap_skip__commit__live_match_short() -> None:
    """(cap_skip) --commit--> released (declined_anchor_lost)

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.publish()
    world.expect(device=2, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired()
    world.issue(1)
    world.expect(device=2, host_free=2, pinned=1, r0="locked", r1="cap_skip", r2=None)
    world.fired("r1: (issued) --lock[over_cap]--> cap_skip")
    world.evict()
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="cap_skip", r2=None)
    world.fired()
    world.complete(1)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired(
        "r1: (cap_skip) --hit[else]--> cap_skip",
        "r1: (cap_skip) --commit[live_match_short]--> released (declined_anchor_lost)",
    )
    world.finish()


def test_cap_skip__commit__device_covers_span() -> None:
    """(cap_skip) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span
    """
    world = LineWorld(BOUNDS)
    world.issue(2, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2="anchor_lost")
    world.fired("r2: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2="anchor_lost")
    world.fired()
    world.publish()
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2="anchor_lost")
    world.fired()
    world.issue(0)
    world.expect(device=2, host_free=2, pinned=2, r0="locked", r1=None, r2="anchor_lost")
    world.fired("r0: (issued) --lock[else]--> locked")
    world.lock(2)
    world.expect(device=2, host_free=2, pinned=2, r0="locked", r1=None, r2="cap_skip")
    world.fired("r2: (anchor_lost) --lock[over_cap]--> cap_skip")
    world.publish()
    world.expect(device=3, host_free=2, pinned=2, r0="locked", r1=None, r2="cap_skip")
    world.fired()
    world.complete(2)
    world.expect(device=3, host_free=2, pinned=2, r0="locked", r1=None, r2=None)
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r2: (cap_skip) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_cap_skip__commit__device_covers_span__also__span_inflight() -> None:
    """(cap_skip) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span; while
    span_inflight held too: the first page key the read would bring (the span's head) is owned
    by a live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.publish()
    world.expect(device=2, host_free=0, pinned=2, r0="reading", r1="locked", r2="cap_skip")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=2, r0="reading", r1="locked", r2="cap_skip")
    world.fired()
    world.complete(2)
    world.expect(device=3, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r2: (cap_skip) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_cap_skip__commit__span_inflight() -> None:
    """(cap_skip) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r2: (cap_skip) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_cap_skip__commit__span_inflight__also__load_slower_than_compute() -> None:
    """(cap_skip) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest; while load_slower_than_compute
    held too: the speeds measured while serving say that loading the span (a read's latency plus
    its tokens at the measured cost per token: the hit's tokens once known, else the whole
    span's) would take longer than computing those tokens; never before both have been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.complete(2, loads_slower=True)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r2: (cap_skip) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_cap_skip__commit__load_slower_than_compute() -> None:
    """(cap_skip) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.complete(2, loads_slower=True)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r2: (cap_skip) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_cap_skip__commit__load_slower_than_compute__also__span_oversize() -> None:
    """(cap_skip) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured; while span_oversize held too: the span the hit found (or its aux
    window) is larger than the whole host pool: no amount of waiting makes room for it
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1=None, r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="cap_skip", r2="locked")
    world.fired("r1: (issued) --lock[over_cap]--> cap_skip")
    world.complete(1, loads_slower=True)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1=None, r2="locked")
    world.fired(
        "r1: (cap_skip) --hit[else]--> cap_skip",
        "r1: (cap_skip) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_cap_skip__commit__span_oversize() -> None:
    """(cap_skip) --commit--> released (declined_host_oversize)

    when span_oversize: the span the hit found (or its aux window) is larger than the whole host
    pool: no amount of waiting makes room for it
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1=None, r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="cap_skip", r2="locked")
    world.fired("r1: (issued) --lock[over_cap]--> cap_skip")
    world.complete(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1=None, r2="locked")
    world.fired(
        "r1: (cap_skip) --hit[else]--> cap_skip",
        "r1: (cap_skip) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_cap_skip__commit__span_oversize__also__parked_ahead() -> None:
    """(cap_skip) --commit--> released (declined_host_oversize)

    when span_oversize: the span the hit found (or its aux window) is larger than the whole host
    pool: no amount of waiting makes room for it; while parked_ahead held too: a hit parked
    before this one still waits for bounce room (a newer hit does not take the room the parked
    head waits for)
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1=None, r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="cap_skip", r2="locked")
    world.fired("r1: (issued) --lock[over_cap]--> cap_skip")
    world.abort(0)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="cap_skip", r2="locked")
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="cap_skip", r2="parked")
    world.fired("r2: (locked) --hit[else]--> locked", "r2: (locked) --commit[host_short]--> parked")
    world.complete(1)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1=None, r2="parked")
    world.fired(
        "r1: (cap_skip) --hit[else]--> cap_skip",
        "r2: (parked) --commit[host_short]--> parked",
        "r1: (cap_skip) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_cap_skip__commit__parked_ahead() -> None:
    """(cap_skip) --commit--> parked

    when parked_ahead: a hit parked before this one still waits for bounce room (a newer hit
    does not take the room the parked head waits for)
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.abort(0)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="locked", r2="cap_skip")
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.complete(1, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2="cap_skip")
    world.fired("r1: (locked) --hit[else]--> locked", "r1: (locked) --commit[host_short]--> parked")
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (cap_skip) --commit[parked_ahead]--> parked",
    )
    world.finish()


def test_cap_skip__commit__parked_ahead__also__host_short() -> None:
    """(cap_skip) --commit--> parked

    when parked_ahead: a hit parked before this one still waits for bounce room (a newer hit
    does not take the room the parked head waits for); while host_short held too: the host pool
    cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=2, r0="reading", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.abort(0)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="locked", r2="cap_skip")
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.complete(1, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2="cap_skip")
    world.fired("r1: (locked) --hit[else]--> locked", "r1: (locked) --commit[host_short]--> parked")
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (cap_skip) --commit[parked_ahead]--> parked",
    )
    world.finish()


def test_cap_skip__commit__host_short() -> None:
    """(cap_skip) --commit--> parked

    when host_short: the host pool cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired()
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.publish()
    world.expect(device=2, host_free=0, pinned=1, r0="reading", r1=None, r2="locked")
    world.fired()
    world.issue(1)
    world.expect(device=2, host_free=0, pinned=1, r0="reading", r1="cap_skip", r2="locked")
    world.fired("r1: (issued) --lock[over_cap]--> cap_skip")
    world.complete(1)
    world.expect(device=2, host_free=0, pinned=1, r0="reading", r1="parked", r2="locked")
    world.fired(
        "r1: (cap_skip) --hit[else]--> cap_skip",
        "r1: (cap_skip) --commit[host_short]--> parked",
    )
    world.finish()


def test_cap_skip__commit__else() -> None:
    """(cap_skip) --commit--> reading

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=2, r0="locked", r1="locked", r2="reading")
    world.fired(
        "r2: (cap_skip) --hit[else]--> cap_skip",
        "r2: (cap_skip) --commit[else]--> reading",
    )
    world.finish()


def test_anchor_lost__commit__live_match_short() -> None:
    """(anchor_lost) --commit--> released (declined_anchor_lost)

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.complete(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[live_match_short]--> released (declined_anchor_lost)",
    )
    world.finish()


def test_anchor_lost__commit__device_covers_span() -> None:
    """(anchor_lost) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span
    """
    world = LineWorld(BOUNDS)
    world.issue(2, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2="anchor_lost")
    world.fired("r2: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2="anchor_lost")
    world.fired()
    world.publish()
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2="anchor_lost")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2="anchor_lost")
    world.fired()
    world.complete(2)
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r2: (anchor_lost) --hit[else]--> anchor_lost",
        "r2: (anchor_lost) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_anchor_lost__commit__device_covers_span__also__span_inflight() -> None:
    """(anchor_lost) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span; while
    span_inflight held too: the first page key the read would bring (the span's head) is owned
    by a live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.issue(2, stale=True)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2="anchor_lost")
    world.fired("r2: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2="anchor_lost")
    world.fired()
    world.publish()
    world.expect(device=2, host_free=0, pinned=0, r0="reading", r1=None, r2="anchor_lost")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2="anchor_lost")
    world.fired()
    world.complete(2)
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r2: (anchor_lost) --hit[else]--> anchor_lost",
        "r2: (anchor_lost) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_anchor_lost__commit__span_inflight() -> None:
    """(anchor_lost) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.issue(1, stale=True)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1="anchor_lost", r2=None)
    world.fired()
    world.complete(1)
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r1: (anchor_lost) --hit[else]--> anchor_lost",
        "r1: (anchor_lost) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_anchor_lost__commit__span_inflight__also__load_slower_than_compute() -> None:
    """(anchor_lost) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest; while load_slower_than_compute
    held too: the speeds measured while serving say that loading the span (a read's latency plus
    its tokens at the measured cost per token: the hit's tokens once known, else the whole
    span's) would take longer than computing those tokens; never before both have been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.issue(1, stale=True)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1="anchor_lost", r2=None)
    world.fired()
    world.complete(1, loads_slower=True)
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r1: (anchor_lost) --hit[else]--> anchor_lost",
        "r1: (anchor_lost) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_anchor_lost__commit__load_slower_than_compute() -> None:
    """(anchor_lost) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, loads_slower=True)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_anchor_lost__commit__load_slower_than_compute__also__span_oversize() -> None:
    """(anchor_lost) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured; while span_oversize held too: the span the hit found (or its aux
    window) is larger than the whole host pool: no amount of waiting makes room for it
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, loads_slower=True)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_anchor_lost__commit__span_oversize() -> None:
    """(anchor_lost) --commit--> released (declined_host_oversize)

    when span_oversize: the span the hit found (or its aux window) is larger than the whole host
    pool: no amount of waiting makes room for it
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_anchor_lost__commit__span_oversize__also__parked_ahead() -> None:
    """(anchor_lost) --commit--> released (declined_host_oversize)

    when span_oversize: the span the hit found (or its aux window) is larger than the whole host
    pool: no amount of waiting makes room for it; while parked_ahead held too: a hit parked
    before this one still waits for bounce room (a newer hit does not take the room the parked
    head waits for)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1, stale=True)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.issue(2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="anchor_lost", r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(2, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="anchor_lost", r2="parked")
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r2: (no_anchor) --commit[host_short]--> parked",
    )
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="anchor_lost", r2="parked")
    world.fired()
    world.complete(1)
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1=None, r2="parked")
    world.fired(
        "r1: (anchor_lost) --hit[else]--> anchor_lost",
        "r2: (parked) --commit[host_short]--> parked",
        "r1: (anchor_lost) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_anchor_lost__commit__parked_ahead() -> None:
    """(anchor_lost) --commit--> parked

    when parked_ahead: a hit parked before this one still waits for bounce room (a newer hit
    does not take the room the parked head waits for)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.issue(2, stale=True)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="anchor_lost")
    world.fired("r2: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="anchor_lost")
    world.fired()
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (anchor_lost) --hit[else]--> anchor_lost",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (anchor_lost) --commit[parked_ahead]--> parked",
    )
    world.finish()


def test_anchor_lost__commit__parked_ahead__also__host_short() -> None:
    """(anchor_lost) --commit--> parked

    when parked_ahead: a hit parked before this one still waits for bounce room (a newer hit
    does not take the room the parked head waits for); while host_short held too: the host pool
    cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.issue(2, stale=True)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="anchor_lost")
    world.fired("r2: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="anchor_lost")
    world.fired()
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (anchor_lost) --hit[else]--> anchor_lost",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (anchor_lost) --commit[parked_ahead]--> parked",
    )
    world.finish()


def test_anchor_lost__commit__host_short() -> None:
    """(anchor_lost) --commit--> parked

    when host_short: the host pool cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1, stale=True)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="anchor_lost", r2=None)
    world.fired()
    world.complete(1, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (anchor_lost) --hit[else]--> anchor_lost",
        "r1: (anchor_lost) --commit[host_short]--> parked",
    )
    world.finish()


def test_anchor_lost__commit__else() -> None:
    """(anchor_lost) --commit--> reading

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.finish()


def test_parked__commit__live_match_short() -> None:
    """(parked) --commit--> released (declined_anchor_lost)

    when live_match_short: a live re-match under the request namespace is shorter than
    matched_len
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1, stale=True)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="anchor_lost", r2=None)
    world.fired()
    world.complete(1, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (anchor_lost) --hit[else]--> anchor_lost",
        "r1: (anchor_lost) --commit[host_short]--> parked",
    )
    world.evict()
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired()
    world.complete(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (abandoned) --read_done[else]--> released (aborted)",
        "r1: (parked) --commit[live_match_short]--> released (declined_anchor_lost)",
    )
    world.finish()


def test_parked__commit__device_covers_span() -> None:
    """(parked) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.issue(2)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2="no_anchor")
    world.fired()
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2="no_anchor")
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.complete(2, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2="parked")
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r2: (no_anchor) --commit[host_short]--> parked",
    )
    world.publish()
    world.expect(device=2, host_free=0, pinned=1, r0="reading", r1=None, r2="parked")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=1, r0="reading", r1=None, r2="parked")
    world.fired()
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=1, r0="staged", r1=None, r2=None)
    world.fired(
        "r0: (reading) --read_done[else]--> staged",
        "r2: (parked) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_parked__commit__device_covers_span__also__span_inflight() -> None:
    """(parked) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span; while
    span_inflight held too: the first page key the read would bring (the span's head) is owned
    by a live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.issue(1, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.issue(2)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1="anchor_lost", r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="no_anchor", r1="anchor_lost", r2="no_anchor")
    world.fired()
    world.complete(1, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="no_anchor", r1="reading", r2="no_anchor")
    world.fired(
        "r1: (anchor_lost) --hit[else]--> anchor_lost",
        "r1: (anchor_lost) --commit[else]--> reading",
    )
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="parked", r1="reading", r2="no_anchor")
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[host_short]--> parked",
    )
    world.complete(2, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="parked", r1="reading", r2="parked")
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r0: (parked) --commit[host_short]--> parked",
        "r2: (no_anchor) --commit[parked_ahead]--> parked",
    )
    world.publish()
    world.expect(device=2, host_free=0, pinned=1, r0="parked", r1="reading", r2="parked")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=1, r0="parked", r1="reading", r2="parked")
    world.fired()
    world.complete(1, "error")
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r1: (reading) --read_done[read_empty]--> released (discarded)",
        "r0: (parked) --commit[else]--> reading",
        "r2: (parked) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_parked__commit__span_inflight() -> None:
    """(parked) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.issue(2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(2, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (no_anchor) --commit[parked_ahead]--> parked",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0=None, r1="reading", r2=None)
    world.fired(
        "r0: (abandoned) --read_done[else]--> released (aborted)",
        "r1: (parked) --commit[else]--> reading",
        "r2: (parked) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_parked__commit__load_slower_than_compute() -> None:
    """(parked) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.poll(loads_slower=True)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired(
        "r1: (parked) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_parked__commit__load_slower_than_compute__also__host_short() -> None:
    """(parked) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured; while host_short held too: the host pool cannot hold the span (and
    its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.poll(loads_slower=True)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired(
        "r1: (parked) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_parked__commit__host_short() -> None:
    """(parked) --commit--> parked

    when host_short: the host pool cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.poll()
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired("r1: (parked) --commit[host_short]--> parked")
    world.finish()


def test_parked__commit__else() -> None:
    """(parked) --commit--> reading

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0=None, r1="reading", r2=None)
    world.fired(
        "r0: (abandoned) --read_done[else]--> released (aborted)",
        "r1: (parked) --commit[else]--> reading",
    )
    world.finish()


def test_locked__commit__device_covers_span() -> None:
    """(locked) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=1, r0=None, r1=None, r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.publish()
    world.expect(device=2, host_free=2, pinned=1, r0=None, r1=None, r2="locked")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=2, pinned=1, r0=None, r1=None, r2="locked")
    world.fired()
    world.complete(2)
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r2: (locked) --hit[else]--> locked",
        "r2: (locked) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_locked__commit__device_covers_span__also__span_inflight() -> None:
    """(locked) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span; while
    span_inflight held too: the first page key the read would bring (the span's head) is owned
    by a live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired()
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.publish()
    world.expect(device=2, host_free=0, pinned=1, r0="reading", r1=None, r2="locked")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=1, r0="reading", r1=None, r2="locked")
    world.fired()
    world.complete(2)
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r2: (locked) --hit[else]--> locked",
        "r2: (locked) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_locked__commit__span_inflight() -> None:
    """(locked) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired()
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.complete(1)
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r1: (locked) --hit[else]--> locked",
        "r1: (locked) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_locked__commit__span_inflight__also__load_slower_than_compute() -> None:
    """(locked) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest; while load_slower_than_compute
    held too: the speeds measured while serving say that loading the span (a read's latency plus
    its tokens at the measured cost per token: the hit's tokens once known, else the whole
    span's) would take longer than computing those tokens; never before both have been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired()
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.complete(1, loads_slower=True)
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r1: (locked) --hit[else]--> locked",
        "r1: (locked) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_locked__commit__load_slower_than_compute() -> None:
    """(locked) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.complete(0, loads_slower=True)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (locked) --hit[else]--> locked",
        "r0: (locked) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_locked__commit__load_slower_than_compute__also__span_oversize() -> None:
    """(locked) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured; while span_oversize held too: the span the hit found (or its aux
    window) is larger than the whole host pool: no amount of waiting makes room for it
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.complete(0, loads_slower=True)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (locked) --hit[else]--> locked",
        "r0: (locked) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_locked__commit__span_oversize() -> None:
    """(locked) --commit--> released (declined_host_oversize)

    when span_oversize: the span the hit found (or its aux window) is larger than the whole host
    pool: no amount of waiting makes room for it
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.complete(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (locked) --hit[else]--> locked",
        "r0: (locked) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_locked__commit__span_oversize__also__parked_ahead() -> None:
    """(locked) --commit--> released (declined_host_oversize)

    when span_oversize: the span the hit found (or its aux window) is larger than the whole host
    pool: no amount of waiting makes room for it; while parked_ahead held too: a hit parked
    before this one still waits for bounce room (a newer hit does not take the room the parked
    head waits for)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(2, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2="parked")
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r2: (no_anchor) --commit[host_short]--> parked",
    )
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1=None, r2="parked")
    world.fired()
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="locked", r2="parked")
    world.fired("r1: (issued) --lock[else]--> locked")
    world.complete(1)
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1=None, r2="parked")
    world.fired(
        "r1: (locked) --hit[else]--> locked",
        "r2: (parked) --commit[host_short]--> parked",
        "r1: (locked) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_locked__commit__parked_ahead() -> None:
    """(locked) --commit--> parked

    when parked_ahead: a hit parked before this one still waits for bounce room (a newer hit
    does not take the room the parked head waits for)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired()
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (locked) --hit[else]--> locked",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (locked) --commit[parked_ahead]--> parked",
    )
    world.finish()


def test_locked__commit__parked_ahead__also__host_short() -> None:
    """(locked) --commit--> parked

    when parked_ahead: a hit parked before this one still waits for bounce room (a newer hit
    does not take the room the parked head waits for); while host_short held too: the host pool
    cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired()
    world.issue(2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2="locked")
    world.fired("r2: (issued) --lock[else]--> locked")
    world.complete(2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (locked) --hit[else]--> locked",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (locked) --commit[parked_ahead]--> parked",
    )
    world.finish()


def test_locked__commit__host_short() -> None:
    """(locked) --commit--> parked

    when host_short: the host pool cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired()
    world.issue(1)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.complete(1, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="abandoned", r1="parked", r2=None)
    world.fired("r1: (locked) --hit[else]--> locked", "r1: (locked) --commit[host_short]--> parked")
    world.finish()


def test_locked__commit__else() -> None:
    """(locked) --commit--> reading

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.complete(0, "short", pages=2)
    world.expect(device=1, host_free=0, pinned=1, r0="reading", r1=None, r2=None)
    world.fired("r0: (locked) --hit[else]--> locked", "r0: (locked) --commit[else]--> reading")
    world.finish()


def test_no_anchor__commit__device_covers_span() -> None:
    """(no_anchor) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span
    """
    world = LineWorld(BOUNDS)
    world.issue(2)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2="no_anchor")
    world.fired()
    world.publish()
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2="no_anchor")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2="no_anchor")
    world.fired()
    world.complete(2)
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r2: (no_anchor) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_no_anchor__commit__device_covers_span__also__span_inflight() -> None:
    """(no_anchor) --commit--> released (declined_device_covered)

    when device_covers_span: the live device tree already holds the whole span; while
    span_inflight held too: the first page key the read would bring (the span's head) is owned
    by a live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.issue(2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="reading", r1=None, r2="no_anchor")
    world.fired()
    world.publish()
    world.expect(device=2, host_free=0, pinned=0, r0="reading", r1=None, r2="no_anchor")
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2="no_anchor")
    world.fired()
    world.complete(2)
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r2: (no_anchor) --commit[device_covers_span]--> released (declined_device_covered)",
    )
    world.finish()


def test_no_anchor__commit__span_inflight() -> None:
    """(no_anchor) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_no_anchor__commit__span_inflight__also__load_slower_than_compute() -> None:
    """(no_anchor) --commit--> released (declined_inflight)

    when span_inflight: the first page key the read would bring (the span's head) is owned by a
    live sibling record (reading, staged, trimmed or consumed): it is already fetching that
    head, and the re-issue after it lands reads only the rest; while load_slower_than_compute
    held too: the speeds measured while serving say that loading the span (a read's latency plus
    its tokens at the measured cost per token: the hit's tokens once known, else the whole
    span's) would take longer than computing those tokens; never before both have been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, loads_slower=True)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[span_inflight]--> released (declined_inflight)",
    )
    world.finish()


def test_no_anchor__commit__load_slower_than_compute() -> None:
    """(no_anchor) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, loads_slower=True)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_no_anchor__commit__load_slower_than_compute__also__span_oversize() -> None:
    """(no_anchor) --commit--> released (declined_slower_than_compute)

    when load_slower_than_compute: the speeds measured while serving say that loading the span
    (a read's latency plus its tokens at the measured cost per token: the hit's tokens once
    known, else the whole span's) would take longer than computing those tokens; never before
    both have been measured; while span_oversize held too: the span the hit found (or its aux
    window) is larger than the whole host pool: no amount of waiting makes room for it
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, loads_slower=True)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[load_slower_than_compute]--> released"
        " (declined_slower_than_compute)",
    )
    world.finish()


def test_no_anchor__commit__span_oversize() -> None:
    """(no_anchor) --commit--> released (declined_host_oversize)

    when span_oversize: the span the hit found (or its aux window) is larger than the whole host
    pool: no amount of waiting makes room for it
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_no_anchor__commit__span_oversize__also__parked_ahead() -> None:
    """(no_anchor) --commit--> released (declined_host_oversize)

    when span_oversize: the span the hit found (or its aux window) is larger than the whole host
    pool: no amount of waiting makes room for it; while parked_ahead held too: a hit parked
    before this one still waits for bounce room (a newer hit does not take the room the parked
    head waits for)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.issue(2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (no_anchor) --commit[span_oversize]--> released (declined_host_oversize)",
    )
    world.finish()


def test_no_anchor__commit__parked_ahead() -> None:
    """(no_anchor) --commit--> parked

    when parked_ahead: a hit parked before this one still waits for bounce room (a newer hit
    does not take the room the parked head waits for)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.issue(2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(2, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (no_anchor) --commit[parked_ahead]--> parked",
    )
    world.finish()


def test_no_anchor__commit__parked_ahead__also__host_short() -> None:
    """(no_anchor) --commit--> parked

    when parked_ahead: a hit parked before this one still waits for bounce room (a newer hit
    does not take the room the parked head waits for); while host_short held too: the host pool
    cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.issue(2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="no_anchor")
    world.fired("r2: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(2, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2="parked")
    world.fired(
        "r2: (no_anchor) --hit[else]--> no_anchor",
        "r1: (parked) --commit[host_short]--> parked",
        "r2: (no_anchor) --commit[parked_ahead]--> parked",
    )
    world.finish()


def test_no_anchor__commit__host_short() -> None:
    """(no_anchor) --commit--> parked

    when host_short: the host pool cannot hold the span (and its aux window) now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.finish()


def test_no_anchor__commit__else() -> None:
    """(no_anchor) --commit--> reading

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.finish()


def test_reading__read_done__read_empty() -> None:
    """(reading) --read_done--> released (discarded)

    when read_empty: the read brought 0 tokens, failed, or its aux window is incomplete
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0, "error")
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (reading) --read_done[read_empty]--> released (discarded)")
    world.finish()


def test_reading__read_done__else() -> None:
    """(reading) --read_done--> staged

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.finish()


def test_reading__abort__else() -> None:
    """(reading) --abort--> abandoned

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.finish()


def test_abandoned__read_done__else() -> None:
    """(abandoned) --read_done--> released (aborted)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.complete(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (abandoned) --read_done[else]--> released (aborted)")
    world.finish()


def test_abandoned__abort__else() -> None:
    """(abandoned) --abort--> abandoned

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (abandoned) --abort[else]--> abandoned")
    world.finish()


def test_reading__give_up__read_outlasts_compute() -> None:
    """(reading) --give_up--> outrun

    when read_outlasts_compute: the read in flight has run longer than computing its tokens
    would take at the forward speed measured while serving (so waiting on can only lose); never
    before a forward has been measured
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.give_up(0, loads_slower=True)
    world.expect(device=0, host_free=0, pinned=0, r0="outrun", r1=None, r2=None)
    world.fired("r0: (reading) --give_up[read_outlasts_compute]--> outrun")
    world.finish()


def test_reading__give_up__else() -> None:
    """(reading) --give_up--> reading

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.give_up(0)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired("r0: (reading) --give_up[else]--> reading")
    world.finish()


def test_outrun__read_done__else() -> None:
    """(outrun) --read_done--> released (outrun_by_compute)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.give_up(0, loads_slower=True)
    world.expect(device=0, host_free=0, pinned=0, r0="outrun", r1=None, r2=None)
    world.fired("r0: (reading) --give_up[read_outlasts_compute]--> outrun")
    world.complete(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (outrun) --read_done[else]--> released (outrun_by_compute)")
    world.finish()


def test_outrun__abort__else() -> None:
    """(outrun) --abort--> outrun

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.give_up(0, loads_slower=True)
    world.expect(device=0, host_free=0, pinned=0, r0="outrun", r1=None, r2=None)
    world.fired("r0: (reading) --give_up[read_outlasts_compute]--> outrun")
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="outrun", r1=None, r2=None)
    world.fired("r0: (outrun) --abort[else]--> outrun")
    world.finish()


def test_staged__plan__prefix_shrank() -> None:
    """(staged) --plan--> released (shrunk)

    when prefix_shrank: device_prefix_len < matched_len (the splice base is gone)
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1, stale=True)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1="anchor_lost", r2=None)
    world.fired("r1: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=2, host_free=2, pinned=1, r0="locked", r1="anchor_lost", r2=None)
    world.fired()
    world.complete(1)
    world.expect(device=2, host_free=0, pinned=1, r0="locked", r1="reading", r2=None)
    world.fired(
        "r1: (anchor_lost) --hit[else]--> anchor_lost",
        "r1: (anchor_lost) --commit[else]--> reading",
    )
    world.complete(1)
    world.expect(device=2, host_free=0, pinned=1, r0="locked", r1="staged", r2=None)
    world.fired("r1: (reading) --read_done[else]--> staged")
    world.evict()
    world.expect(device=1, host_free=0, pinned=1, r0="locked", r1="staged", r2=None)
    world.fired()
    world.plan(1)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r1: (staged) --plan[prefix_shrank]--> released (shrunk)")
    world.finish()


def test_staged__plan__span_device_resident() -> None:
    """(staged) --plan--> released (device_covered)

    when span_device_resident: device_prefix_len >= span_end (the span is already on the device)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0, "short", pages=1)
    world.expect(device=0, host_free=1, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=1, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (staged) --plan[span_device_resident]--> released (device_covered)")
    world.finish()


def test_staged__plan__trim_positive() -> None:
    """(staged) --plan--> trimmed

    when trim_positive: device_prefix_len > matched_len (a sibling published the head)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.finish()


def test_staged__plan__else() -> None:
    """(staged) --plan--> staged

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.finish()


def test_trimmed__plan__prefix_shrank() -> None:
    """(trimmed) --plan--> released (shrunk)

    when prefix_shrank: device_prefix_len < matched_len (the splice base is gone)
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=2, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.issue(1)
    world.expect(device=2, host_free=2, pinned=2, r0="anchor_lost", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.complete(0, "short", pages=2)
    world.expect(device=2, host_free=0, pinned=2, r0="reading", r1="locked", r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=2, host_free=0, pinned=2, r0="staged", r1="locked", r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=2, host_free=0, pinned=2, r0="trimmed", r1="locked", r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.abort(1)
    world.expect(device=2, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r1: (locked) --abort[else]--> released (aborted)")
    world.evict()
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.evict()
    world.expect(device=0, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (trimmed) --plan[prefix_shrank]--> released (shrunk)")
    world.finish()


def test_trimmed__plan__span_device_resident() -> None:
    """(trimmed) --plan--> released (device_covered)

    when span_device_resident: device_prefix_len >= span_end (the span is already on the device)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.publish()
    world.expect(device=2, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (trimmed) --plan[span_device_resident]--> released (device_covered)")
    world.finish()


def test_trimmed__plan__trim_positive() -> None:
    """(trimmed) --plan--> trimmed

    when trim_positive: device_prefix_len > matched_len (a sibling published the head)
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (trimmed) --plan[trim_positive]--> trimmed")
    world.finish()


def test_trimmed__plan__else() -> None:
    """(trimmed) --plan--> staged

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.evict()
    world.expect(device=0, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (trimmed) --plan[else]--> staged")
    world.finish()


def test_staged__make_room__device_fits() -> None:
    """(staged) --make_room--> staged

    when device_fits: the device pool (and the aux pool) can hold the planned tail now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.consume(0)
    world.expect(device=2, host_free=0, pinned=0, r0="consumed", r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[device_fits]--> staged",
        "r0: (staged) --consume[else]--> consumed",
    )
    world.finish()


def test_staged__make_room__device_fits__also__plan_stale() -> None:
    """(staged) --make_room--> staged

    when device_fits: the device pool (and the aux pool) can hold the planned tail now; while
    plan_stale held too: the live match differs from the planned prefix or the caller's prefix
    indices
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.consume(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[device_fits]--> staged",
        "r0: (staged) --consume[plan_stale]--> released (dropped)",
    )
    world.finish()


def test_staged__make_room__plan_stale() -> None:
    """(staged) --make_room--> staged

    when plan_stale: the live match differs from the planned prefix or the caller's prefix
    indices
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=2, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.consume(0)
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[plan_stale]--> staged",
        "r0: (staged) --consume[plan_stale]--> released (dropped)",
    )
    world.finish()


def test_staged__make_room__else() -> None:
    """(staged) --make_room--> staged

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0, stale=True)
    world.expect(device=2, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=3, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=3, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.consume(0)
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[else]--> staged",
        "r0: (staged) --consume[device_short]--> released (device_capacity)",
    )
    world.finish()


def test_trimmed__make_room__device_fits() -> None:
    """(trimmed) --make_room--> trimmed

    when device_fits: the device pool (and the aux pool) can hold the planned tail now
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.consume(0)
    world.expect(device=2, host_free=0, pinned=0, r0="consumed", r1=None, r2=None)
    world.fired(
        "r0: (trimmed) --make_room[device_fits]--> trimmed",
        "r0: (trimmed) --consume[else]--> consumed",
    )
    world.finish()


def test_trimmed__make_room__device_fits__also__plan_stale() -> None:
    """(trimmed) --make_room--> trimmed

    when device_fits: the device pool (and the aux pool) can hold the planned tail now; while
    plan_stale held too: the live match differs from the planned prefix or the caller's prefix
    indices
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.evict()
    world.expect(device=0, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.consume(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (trimmed) --make_room[device_fits]--> trimmed",
        "r0: (trimmed) --consume[plan_stale]--> released (dropped)",
    )
    world.finish()


def test_trimmed__make_room__plan_stale() -> None:
    """(trimmed) --make_room--> trimmed

    when plan_stale: the live match differs from the planned prefix or the caller's prefix
    indices
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.publish()
    world.expect(device=2, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=4, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.consume(0)
    world.expect(device=4, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (trimmed) --make_room[plan_stale]--> trimmed",
        "r0: (trimmed) --consume[plan_stale]--> released (dropped)",
    )
    world.finish()


def test_trimmed__make_room__else() -> None:
    """(trimmed) --make_room--> trimmed

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0, stale=True)
    world.expect(device=2, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=3, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=4, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=4, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.consume(0)
    world.expect(device=4, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (trimmed) --make_room[else]--> trimmed",
        "r0: (trimmed) --consume[device_short]--> released (device_capacity)",
    )
    world.finish()


def test_staged__consume__plan_stale() -> None:
    """(staged) --consume--> released (dropped)

    when plan_stale: the live match differs from the planned prefix or the caller's prefix
    indices
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.consume(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[device_fits]--> staged",
        "r0: (staged) --consume[plan_stale]--> released (dropped)",
    )
    world.finish()


def test_staged__consume__plan_stale__also__device_short() -> None:
    """(staged) --consume--> released (dropped)

    when plan_stale: the live match differs from the planned prefix or the caller's prefix
    indices; while device_short held too: the device pool cannot hold the splice even after
    eviction
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=2, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.consume(0)
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[plan_stale]--> staged",
        "r0: (staged) --consume[plan_stale]--> released (dropped)",
    )
    world.finish()


def test_staged__consume__device_short() -> None:
    """(staged) --consume--> released (device_capacity)

    when device_short: the device pool cannot hold the splice even after eviction
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0, stale=True)
    world.expect(device=2, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=3, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=3, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.consume(0)
    world.expect(device=3, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[else]--> staged",
        "r0: (staged) --consume[device_short]--> released (device_capacity)",
    )
    world.finish()


def test_staged__consume__else() -> None:
    """(staged) --consume--> consumed

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.consume(0)
    world.expect(device=2, host_free=0, pinned=0, r0="consumed", r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[device_fits]--> staged",
        "r0: (staged) --consume[else]--> consumed",
    )
    world.finish()


def test_trimmed__consume__plan_stale() -> None:
    """(trimmed) --consume--> released (dropped)

    when plan_stale: the live match differs from the planned prefix or the caller's prefix
    indices
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.evict()
    world.expect(device=0, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.consume(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (trimmed) --make_room[device_fits]--> trimmed",
        "r0: (trimmed) --consume[plan_stale]--> released (dropped)",
    )
    world.finish()


def test_trimmed__consume__plan_stale__also__device_short() -> None:
    """(trimmed) --consume--> released (dropped)

    when plan_stale: the live match differs from the planned prefix or the caller's prefix
    indices; while device_short held too: the device pool cannot hold the splice even after
    eviction
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.publish()
    world.expect(device=2, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=3, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=4, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired()
    world.consume(0)
    world.expect(device=4, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (trimmed) --make_room[plan_stale]--> trimmed",
        "r0: (trimmed) --consume[plan_stale]--> released (dropped)",
    )
    world.finish()


def test_trimmed__consume__device_short() -> None:
    """(trimmed) --consume--> released (device_capacity)

    when device_short: the device pool cannot hold the splice even after eviction
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.publish()
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0, stale=True)
    world.expect(device=2, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.publish()
    world.expect(device=3, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired()
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (anchor_lost) --hit[else]--> anchor_lost",
        "r0: (anchor_lost) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=3, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=4, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=4, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.consume(0)
    world.expect(device=4, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired(
        "r0: (trimmed) --make_room[else]--> trimmed",
        "r0: (trimmed) --consume[device_short]--> released (device_capacity)",
    )
    world.finish()


def test_trimmed__consume__else() -> None:
    """(trimmed) --consume--> consumed

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.consume(0)
    world.expect(device=2, host_free=0, pinned=0, r0="consumed", r1=None, r2=None)
    world.fired(
        "r0: (trimmed) --make_room[device_fits]--> trimmed",
        "r0: (trimmed) --consume[else]--> consumed",
    )
    world.finish()


def test_consumed__ack__copy_failed() -> None:
    """(consumed) --ack--> released (load_failed)

    when copy_failed: the H2D copy of the spliced tail failed (its completion carries an error):
    the tail's device bytes are not L3's
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.consume(0)
    world.expect(device=2, host_free=0, pinned=0, r0="consumed", r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[device_fits]--> staged",
        "r0: (staged) --consume[else]--> consumed",
    )
    world.complete(0, "error")
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (consumed) --ack[copy_failed]--> released (load_failed)")
    world.finish()


def test_consumed__ack__else() -> None:
    """(consumed) --ack--> released (filled)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.consume(0)
    world.expect(device=2, host_free=0, pinned=0, r0="consumed", r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[device_fits]--> staged",
        "r0: (staged) --consume[else]--> consumed",
    )
    world.complete(0)
    world.expect(device=2, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (consumed) --ack[else]--> released (filled)")
    world.finish()


def test_locked__abort__else() -> None:
    """(locked) --abort--> released (aborted)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.abort(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (locked) --abort[else]--> released (aborted)")
    world.finish()


def test_no_anchor__abort__else() -> None:
    """(no_anchor) --abort--> released (aborted)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.abort(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (no_anchor) --abort[else]--> released (aborted)")
    world.finish()


def test_cap_skip__abort__else() -> None:
    """(cap_skip) --abort--> released (aborted)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.publish()
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired()
    world.issue(0)
    world.expect(device=1, host_free=2, pinned=1, r0="locked", r1=None, r2=None)
    world.fired("r0: (issued) --lock[else]--> locked")
    world.issue(1)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r1: (issued) --lock[else]--> locked")
    world.issue(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2="cap_skip")
    world.fired("r2: (issued) --lock[over_cap]--> cap_skip")
    world.abort(2)
    world.expect(device=1, host_free=2, pinned=2, r0="locked", r1="locked", r2=None)
    world.fired("r2: (cap_skip) --abort[else]--> released (aborted)")
    world.finish()


def test_anchor_lost__abort__else() -> None:
    """(anchor_lost) --abort--> released (aborted)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0, stale=True)
    world.expect(device=0, host_free=2, pinned=0, r0="anchor_lost", r1=None, r2=None)
    world.fired("r0: (issued) --lock[live_match_short]--> anchor_lost")
    world.abort(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (anchor_lost) --abort[else]--> released (aborted)")
    world.finish()


def test_parked__abort__else() -> None:
    """(parked) --abort--> released (aborted)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.abort(0)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r0: (reading) --abort[else]--> abandoned")
    world.issue(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="no_anchor", r2=None)
    world.fired("r1: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(1, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1="parked", r2=None)
    world.fired(
        "r1: (no_anchor) --hit[else]--> no_anchor",
        "r1: (no_anchor) --commit[host_short]--> parked",
    )
    world.abort(1)
    world.expect(device=0, host_free=0, pinned=0, r0="abandoned", r1=None, r2=None)
    world.fired("r1: (parked) --abort[else]--> released (aborted)")
    world.finish()


def test_staged__abort__else() -> None:
    """(staged) --abort--> released (aborted)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.abort(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (staged) --abort[else]--> released (aborted)")
    world.finish()


def test_trimmed__abort__else() -> None:
    """(trimmed) --abort--> released (aborted)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.abort(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (trimmed) --abort[else]--> released (aborted)")
    world.finish()


def test_staged__release_hold__else() -> None:
    """(staged) --release_hold--> released (released)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.release_hold(0)
    world.expect(device=0, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (staged) --release_hold[else]--> released (released)")
    world.finish()


def test_trimmed__release_hold__else() -> None:
    """(trimmed) --release_hold--> released (released)

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.publish()
    world.expect(device=1, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired()
    world.plan(0)
    world.expect(device=1, host_free=0, pinned=0, r0="trimmed", r1=None, r2=None)
    world.fired("r0: (staged) --plan[trim_positive]--> trimmed")
    world.release_hold(0)
    world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    world.fired("r0: (trimmed) --release_hold[else]--> released (released)")
    world.finish()


def test_consumed__abort__else() -> None:
    """(consumed) --abort--> consumed

    when otherwise
    """
    world = LineWorld(BOUNDS)
    world.issue(0)
    world.expect(device=0, host_free=2, pinned=0, r0="no_anchor", r1=None, r2=None)
    world.fired("r0: (issued) --lock[root_prefix]--> no_anchor")
    world.complete(0, "short", pages=2)
    world.expect(device=0, host_free=0, pinned=0, r0="reading", r1=None, r2=None)
    world.fired(
        "r0: (no_anchor) --hit[else]--> no_anchor",
        "r0: (no_anchor) --commit[else]--> reading",
    )
    world.complete(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (reading) --read_done[else]--> staged")
    world.plan(0)
    world.expect(device=0, host_free=0, pinned=0, r0="staged", r1=None, r2=None)
    world.fired("r0: (staged) --plan[else]--> staged")
    world.consume(0)
    world.expect(device=2, host_free=0, pinned=0, r0="consumed", r1=None, r2=None)
    world.fired(
        "r0: (staged) --make_room[device_fits]--> staged",
        "r0: (staged) --consume[else]--> consumed",
    )
    world.abort(0)
    world.expect(device=2, host_free=0, pinned=0, r0="consumed", r1=None, r2=None)
    world.fired("r0: (consumed) --abort[else]--> consumed")
    world.finish()
