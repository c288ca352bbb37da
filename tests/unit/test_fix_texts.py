"""Every engine rule's fix, applied as written, clears the rule it is the fix of and raises no
new error (issue 32: a fix offered `bfloat16` for a KV dtype 0.5.23 rejects on V4).

The rules come from their registry (orchestrator.planner.static.rule_ids: the static half's and
the host GPU's, with each family's members: the engine's accepted knobs, every kind of flag
problem, every catalog known-bad entry), so a new rule is held to its fix here at once: it needs
a profile that raises it in TRIGGERS, or a line in NOT_CHECKABLE saying why its fix is not one
profile edit. A fix that is one has it as data (Check.change), and its text is rendered from it
(orchestrator.errors.fix_text): the test applies that edit to the profile and plans again, the
static half with `validate`'s own function, a GPU rule with plan on the inventory's declared
host.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.catalog import load_catalog
from orchestrator.errors import FixChange, fix_text
from orchestrator.planner import checks as checks_mod
from orchestrator.planner import exposure, rules, static
from orchestrator.planner.build import build_plan, load_context
from orchestrator.planner.static import RULE_FAMILIES, check_profile, rule_ids
from tests.validate.helpers import INVENTORY, PROFILES

STATIC, GPU = rule_ids(load_catalog())


@dataclass(frozen=True)
class Trigger:
    """A profile that raises the rule: a shipped profile with ``edits`` (dotted path -> value),
    on the inventory's host with GPU ``gpu`` (its model id; None: as declared)."""

    base: str
    edits: dict[str, Any] = field(default_factory=dict)
    gpu: str | None = None


TP8, PD = "mxfp4-tp8.yaml", "default.yaml"  # colocated MXFP4 TP8/EP8; PD NVFP4 (sm_120 hosts)

TRIGGERS: dict[str, Trigger] = {
    "topology.tp-gpus": Trigger(TP8, {"topology.engine.gpus": [0, 1, 2, 3]}),
    "topology.ep": Trigger(TP8, {"topology.engine.ep": 3}),
    "topology.attn-dp": Trigger(TP8, {"topology.engine.attn_dp": 3}),
    "capacity.layout": Trigger(TP8, {"topology.engine.ep": 4}),
    "profile.env-reserved": Trigger(TP8, {"topology.engine.env": {"CUDA_VISIBLE_DEVICES": "0"}}),
    "engine.index-topk": Trigger(TP8, {"attention.index_topk": 768}),
    "engine.kv-cache-dtype": Trigger(TP8, {"attention.kv_cache_dtype": "bfloat16"}),
    "engine.context-length": Trigger(TP8, {"attention.context_length": 2 * 1048576}),
    "engine.speculative": Trigger(TP8, {"speculative.algorithm": "dspark"}),
    "model.trust-remote-code": Trigger(TP8, {"model.trust_remote_code": True}),
    "kernels.deprecated-key": Trigger(TP8, {"kernels.enabled": False}),
    "engine.foreign-code-flag": Trigger(TP8, {"topology.engine.extra_args": [
        "--custom-weight-loader", "my_pkg.load"]}),
    "engine.flag-invalid-choice": Trigger(PD, {"moe.runner_backend": "flashinfer_cutlas"}),
    "engine.moe-runner-unavailable": Trigger(TP8, {"moe.runner_backend": "flashinfer_trtllm"}),
    "engine.moe-runner-fallback": Trigger(TP8, {"moe.runner_backend": "marlin"}),
    "kernels.engine-path-unsupported": Trigger(TP8, {"topology.engine.attn_dp": 1,
                                                     "kernels.attention": "engine"}),
    "kernels.bundled-no-effect": Trigger(TP8, {"kernels.mhc_pre": "bundled"}, gpu="b200"),
    "known-bad.marlin-mxfp4-nan-sm120": Trigger(TP8, {"moe.runner_backend": "marlin"}),
    "known-bad.fp4-dequant-needs-auto-runner": Trigger(TP8, {
        "model.expert_storage": "fp8", "moe.runner_backend": "flashinfer_mxfp4"}),
    "known-bad.index-topk-512-long-context-recall": Trigger(TP8, {"attention.index_topk": 512}),
    "known-bad.mooncake-needs-rdma": Trigger(PD, {"topology.transfer_backend": "mooncake"}),
}

_CHOSEN = "which GPU replaces it is the operator's choice (another role's, or a free one)"
_FLAG_WORD = ("a problem of a word of a rendered command line, which comes from the role's "
              "extra_args: how to rewrite the operator's own words is theirs to say")
_KB_EXTRA = "it removes a flag from a role's extra_args, words of the operator's own"
NOT_CHECKABLE: dict[str, str] = {
    "topology.gpu-duplicate": _CHOSEN,
    "topology.gpu-overlap": _CHOSEN,
    "topology.tp-heads": "a TP size that divides the heads needs as many GPUs listed: the TP "
                         "size and the GPUs that carry it are chosen together",
    "topology.port-conflict": "a free port is the host's to know (ports in use are a host "
                              "fact), and a role's other ports follow its port",
    "engine.flag-table": "pinning another engine version changes every rule the plan applies; "
                         "which one is the operator's choice",
    "engine.render": "a command line that cannot be rendered says what the renderer refused; "
                     "its fix is the renderer's text about the operator's words",
    "engine.flag-reserved": "the flag in extra_args has a profile field instead, whose value "
                            "is the operator's (the fix names the field, not a value)",
    **{rid: _FLAG_WORD for rid in STATIC if rid.startswith("engine.flag-")
       and rid not in ("engine.flag-table", "engine.flag-reserved", "engine.flag-invalid-choice")},
    "engine.moe-runner-unknown": "the catalog does not know this kernel path: verifying it is "
                                 "a run on the host, not a profile edit",
    "engine.moe-runner": "information (the MoE kernel path): no fix",
    "kernels.measurement-ignored": "the fix is a new measurement on the host (`dsv4ctl "
                                   "qualify kernels`), not a profile edit",
    "known-bad.w4a16-marlin-corruption-sm120": "another checkpoint (model.variant and its "
                                               "files) is the operator's to choose and fetch",
    "known-bad.trtllm-moe-sm100-only": "the runner to use depends on the checkpoint's format; "
                                       "one entry covers both formats",
    "known-bad.nvfp4-auto-picks-trtllm-routed": "the runner to use depends on the GPU "
                                                "(flashinfer_cutlass on sm_120, marlin on "
                                                "sm_90); one entry covers both",
    "known-bad.nvfp4-online-sm100-only": _KB_EXTRA,
    "known-bad.dsv4-trtllm-attn-sm100-no-pd": _KB_EXTRA,
    "known-bad.allreduce-fusion-not-sm120": _KB_EXTRA,
    "known-bad.sm120-mxfp4-slow-prefill": "information: no fix is known",
}


def test_every_rule_is_held_to_its_fix_or_says_why_not() -> None:
    every = set(STATIC) | set(GPU)
    assert not set(TRIGGERS) & set(NOT_CHECKABLE)
    assert set(TRIGGERS) | set(NOT_CHECKABLE) == every, (
        "missing:", sorted(every - set(TRIGGERS) - set(NOT_CHECKABLE)),
        "not rules:", sorted((set(TRIGGERS) | set(NOT_CHECKABLE)) - every))


# the functions that raise engine rules (whole modules, or these functions of a module)
RULE_SOURCES = {rules: None, static: None, exposure: ("foreign_flag_checks",),
                checks_mod: ("topology_checks", "_port_conflicts", "layout_check")}


def _raised_ids() -> set[str]:
    """Every rule id a check() call of the rule sources names: a literal, or an f-string's
    literal prefix (a family)."""
    found: set[str] = set()
    for mod, names in RULE_SOURCES.items():
        tree = ast.parse(inspect.getsource(mod))
        roots = [n for n in tree.body if names is None or (
            isinstance(n, ast.FunctionDef) and n.name in names)]
        for root in roots:
            for node in ast.walk(root):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "check" and node.args):
                    continue
                first = node.args[0]
                if isinstance(first, ast.Constant):
                    found.add(first.value)
                elif isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant):
                    found.add(f"{first.values[0].value}*")
    return found


def test_the_registry_names_every_rule_the_rule_modules_raise() -> None:
    raised = _raised_ids()
    assert raised, "the scan found no check() call"
    families = {f"{p}*" for p in RULE_FAMILIES}
    listed = set(STATIC) | set(GPU)
    assert not {r for r in raised if r.endswith("*")} - families
    assert not {r for r in raised if not r.endswith("*")} - listed


def _apply(doc: dict[str, Any], change: tuple[FixChange, ...]) -> None:
    """The edits of one fix, as written (list indices are of the list before the edit)."""
    removals: dict[int, tuple[list[Any], list[int]]] = {}
    for c in change:
        *parents, leaf = c.field.split(".")
        node: Any = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        if c.remove and isinstance(node, list):
            removals.setdefault(id(node), (node, []))[1].append(int(leaf))
        elif c.remove:
            del node[leaf]
        else:
            node[leaf] = c.value
    for lst, indices in removals.values():
        for i in sorted(indices, reverse=True):
            del lst[i]


def _findings(rule: str, t: Trigger, doc: dict[str, Any], tmp: Path) -> list[Any]:
    inv = yaml.safe_load(INVENTORY.read_text())
    if t.gpu is not None:
        inv["hosts"]["gpu-host"]["gpus"]["model"] = t.gpu
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(inv))
    path = tmp / "profile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    if rule in STATIC:  # the static half: what validate reports
        return check_profile(path)[1]
    return build_plan(load_context(path, None)).checks


def _profile(t: Trigger) -> dict[str, Any]:
    doc = yaml.safe_load((PROFILES / t.base).read_text())
    _apply(doc, tuple(FixChange(k, v) for k, v in t.edits.items()))
    return doc


@pytest.mark.parametrize("rule", sorted(TRIGGERS))
def test_a_fix_applied_as_written_clears_its_rule(rule: str, tmp_path: Path) -> None:
    t = TRIGGERS[rule]
    doc = _profile(t)
    before = _findings(rule, t, doc, tmp_path)
    raised = [c for c in before if c.id == rule and c.severity != "info"]
    assert raised, f"the trigger does not raise {rule}: {[c.id for c in before]}"
    for c in raised:
        assert c.change, (f"{rule}'s fix is no profile edit ({c.fix!r}): give it one "
                          "(Check.change), or list the rule in NOT_CHECKABLE with why not")
        assert c.fix and c.fix.startswith(fix_text(c.change)), c.fix  # the text is the edit's
    errors_before = {(c.id, c.subject) for c in before if c.severity == "error"}
    fixed = _profile(t)
    _apply(fixed, raised[0].change)
    after = _findings(rule, t, fixed, tmp_path)
    assert not [c for c in after if c.id == rule and c.severity != "info"], (
        f"{rule} is still raised after its fix {raised[0].fix!r}")
    new = {(c.id, c.subject) for c in after if c.severity == "error"} - errors_before
    assert not new, f"the fix {raised[0].fix!r} of {rule} raises {sorted(new)}"
