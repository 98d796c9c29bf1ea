"""The `x-lab-fault` value a faulted response carries (lab.faults.flows.FlowFaults.fault_tag):
the kinds applied, in order, each once; none on an untouched flow. (The live tests in
test_live_faults.py see it on the wire, from a real mitmdump.)"""

from __future__ import annotations

from lab.faults.flows import FlowFaults
from lab.faults.kinds.base import Fired
from tests.faults.test_pipeline import FACTS


def test_an_untouched_flow_has_no_tag() -> None:
    assert FlowFaults(FACTS).fault_tag() is None


def test_the_tag_names_each_kind_once_in_the_order_applied() -> None:
    ff = FlowFaults(FACTS)
    for kind in ("strip_protocol_version", "rewrite_origin", "strip_protocol_version"):
        ff.faults.append(Fired(kind, f"{kind}#0", "d_1").tag())
    assert ff.fault_tag() == "strip_protocol_version,rewrite_origin"
