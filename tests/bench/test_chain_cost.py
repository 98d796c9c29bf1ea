"""bench/bench_chain_cost.py's ratios: each round's now / before figure, paired by round."""

from __future__ import annotations

from bench_chain_cost import ratios


def test_each_round_is_paired_with_the_same_round_of_the_other_tree() -> None:
    named = [
        ("41bf6ba:faults-1", {"chain": 300.0}),
        ("now:faults-1", {"chain": 210.0}),
        ("41bf6ba:faults-2", {"chain": 200.0}),
        ("now:faults-2", {"chain": 150.0}),
        ("now:clean-1", {"chain": 99.0}),  # another kind: not paired with faults
    ]
    assert ratios(named, "41bf6ba", "faults", "chain") == [0.7, 0.75]
    assert ratios(named, "41bf6ba", "clean", "chain") == []  # no before run of that round
