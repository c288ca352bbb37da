"""Engine and router argv: full 0.5.23 flag names, values from the resolved deployment, nothing
rendered that the profile did not ask for. The real parsers check these
lists too (tests/validate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import RenderError
from orchestrator.render.argv import engine_argv, engine_program, router_argv, router_program
from tests.validate.helpers import PROFILES, render_path, render_text


def _opts(argv: list[str]) -> dict[str, list[str]]:
    """option -> the words that follow it up to the next option."""
    out: dict[str, list[str]] = {}
    key = None
    for w in argv:
        if w.startswith("--"):
            assert w not in out, f"{w} rendered twice"
            key = w
            out[w] = []
        else:
            assert key is not None
            out[key].append(w)
    return out


def _variant(**patch: object) -> str:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    for dotted, value in patch.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return yaml.safe_dump(data)


def test_default_pd_roles() -> None:
    _, dep, _ = render_path(PROFILES / "default.yaml")
    pre, dec = (_opts(engine_argv(dep, r)) for r in dep.roles)
    for o in (pre, dec):
        assert o["--model-path"] == ["/models/DeepSeek-V4-Flash-NVFP4"]
        assert o["--served-model-name"] == ["deepseek-v4-flash"]
        assert o["--host"] == ["127.0.0.1"]
        assert o["--tp-size"] == ["4"] and o["--ep-size"] == ["4"]
        assert "--attn-dp-size" not in o  # attn_dp 1 is the engine default
        assert o["--moe-runner-backend"] == ["flashinfer_cutlass"]
        assert o["--kv-cache-dtype"] == ["fp8_e4m3"]
        assert json.loads(o["--json-model-override-args"][0]) == {"index_topk": 1024}
        assert o["--context-length"] == ["1048576"]
        assert o["--reasoning-parser"] == ["deepseek-v4"]
        assert o["--tool-call-parser"] == ["deepseekv4"]
        assert o["--disaggregation-transfer-backend"] == ["mooncake_tcp"]
        sampling = json.loads(o["--preferred-sampling-params"][0])
        assert sampling == {"temperature": 1.0, "top_p": 0.95}
        assert "--enable-metrics" in o and "--enable-cache-report" in o
    assert pre["--disaggregation-mode"] == ["prefill"]
    assert dec["--disaggregation-mode"] == ["decode"]
    assert pre["--disaggregation-bootstrap-port"] == ["8998"]
    assert "--disaggregation-bootstrap-port" not in dec
    assert pre["--chunked-prefill-size"] == ["8192"]
    assert dec["--cuda-graph-max-bs-decode"] == ["64"]
    # one host, two instances: every listening port differs
    for flag in ("--port", "--nccl-port", "--engine-info-bootstrap-port"):
        assert pre[flag] != dec[flag], flag


def test_colocated_has_no_pd_flags() -> None:
    _, dep, _ = render_path(PROFILES / "mxfp4-tp8.yaml")
    (role,) = dep.roles
    o = _opts(engine_argv(dep, role))
    assert o["--tp-size"] == ["8"] and o["--ep-size"] == ["8"]
    assert not [k for k in o if k.startswith("--disaggregation")]
    assert dep.router is None
    with pytest.raises(RenderError, match="no router"):
        router_argv(dep)


def test_optional_flags_follow_the_profile() -> None:
    text = _variant(moe__runner_backend="auto", attention__fp4_indexer=True,
                    attention__index_topk=None, serving__enable_cache_report=False,
                    serving__mem_fraction_static=0.8)
    _, dep, _ = render_text(text)
    o = _opts(engine_argv(dep, dep.roles[0]))
    assert "--moe-runner-backend" not in o  # auto: the engine decides
    assert "--enable-deepseek-v4-fp4-indexer" in o
    assert "--enable-cache-report" not in o
    assert o["--mem-fraction-static"] == ["0.8"]
    # index_topk unset: the model default (512) is still rendered explicitly
    assert json.loads(o["--json-model-override-args"][0]) == {"index_topk": 512}


def test_speculative_eagle_and_dspark() -> None:
    _, dep, _ = render_text(_variant(speculative={"algorithm": "eagle", "num_steps": 3,
                                                  "num_draft_tokens": 4}))
    o = _opts(engine_argv(dep, dep.roles[1]))
    assert o["--speculative-algorithm"] == ["EAGLE"]
    assert o["--speculative-eagle-topk"] == ["1"]
    assert o["--speculative-num-steps"] == ["3"] and o["--speculative-num-draft-tokens"] == ["4"]
    _, dep, _ = render_text(_variant(speculative={"algorithm": "dspark", "dspark_block_size": 4}))
    o = _opts(engine_argv(dep, dep.roles[1]))
    assert o["--speculative-algorithm"] == ["DSPARK"]
    assert o["--speculative-dspark-block-size"] == ["4"]
    assert "--speculative-eagle-topk" not in o


def test_extra_args_come_last_verbatim() -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["topology"]["decode"]["extra_args"] = ["--log-level", "debug", "--disable-radix-cache"]
    _, dep, _ = render_text(yaml.safe_dump(data))
    argv = engine_argv(dep, dep.role("decode"))
    assert argv[-3:] == ["--log-level", "debug", "--disable-radix-cache"]
    assert "--log-level" not in engine_argv(dep, dep.role("prefill"))


def test_router_argv() -> None:
    _, dep, _ = render_path(PROFILES / "default.yaml")
    argv = router_argv(dep, worker_startup_timeout_s=1800)
    assert argv[0] == "--pd-disaggregation"
    o = _opts(argv)
    assert o["--prefill"] == ["http://127.0.0.1:30001", "8998"]  # port always given
    assert o["--decode"] == ["http://127.0.0.1:30002"]
    assert o["--port"] == ["8000"] and o["--prometheus-port"] == ["29000"]
    assert o["--policy"] == ["cache_aware"]
    assert o["--worker-startup-timeout-secs"] == ["1800"]


def test_programs_come_from_the_engine_env() -> None:
    _, dep, _ = render_path(PROFILES / "default.yaml")
    assert engine_program(dep) == ["/opt/sglang/bin/sglang", "serve"]
    assert router_program(dep) == ["/opt/sglang/bin/python", "-m", "sglang_router.launch_router"]


def test_no_abbreviated_or_removed_flags() -> None:
    """Names 0.5.23 removed, or that work only as prefixes, are never rendered (sglang.md §2.1)."""
    banned = {"--tp", "--ep", "--cuda-graph-max-bs", "--enable-dp-attention", "--dp",
              "--nsa-prefill-backend", "--nsa-decode-backend", "--gpu-memory-utilization"}
    for path in sorted(Path(PROFILES).glob("*.yaml")):
        if path.name == "inventory.yaml":
            continue
        _, dep, _ = render_path(path)
        for role in dep.roles:
            assert not banned & set(engine_argv(dep, role)), path.name
