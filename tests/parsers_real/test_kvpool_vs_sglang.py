"""CI proof that ``orchestrator/planner/kvpool.py`` equals SGLang 0.5.23's own KV-pool sizing.

Owns the cross-check behind every KV-capacity number the planner prints: for named corner cases
(FP4 indexer, BF16 compress state, EAGLE, DSpark, HiSparse, attention-DP, PD prefill/decode,
online c128 with and without MTP, ``--max-total-tokens``, short layer stages, both startup
failures) and a seeded random sample of 400 deployments, :func:`kvpool.size_pool` must give
exactly what the installed sglang 0.5.23 computes: KV budget, bytes per full token (bit-equal
float), bytes per SWA token, fixed bytes, ring sizes, every pool's token count, the running
requests per worker, and the same startup error. The reference is sglang's real code, run by
``tests/parsers_real/sglang_pool_oracle.py`` (its docstring says what is extracted and what is
stubbed). Further tests prove the comparison can fail (perturbed kvpool constants are caught),
that both sides reject the same impossible speculative configurations, and that a missing or
re-shaped sglang fails with a message naming what moved.

Needs requirements/parsers.txt (sglang 0.5.23 + CPU torch); never skips: a missing package, a
different version or a moved function is a failure. About 5 s on 2 cores.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.planner import kvpool as K
from orchestrator.planner.kvpool import (
    DSV4_FLASH_COMPRESS_RATIOS,
    DisaggMode,
    KVPoolError,
    KVPoolInputs,
    SpecAlgorithm,
    StateDtype,
)
from tests.parsers_real import sglang_pool_oracle as oracle
from tests.parsers_real.sglang_pool_oracle import SglangDeployment, SglangShapeError, SglangSizing

GIB = 1 << 30
#: RTX PRO 6000 Blackwell: 97,887 MiB (research/model-hw.md); the deployment target.
RTX_PRO_6000 = 97_887 * (1 << 20)
SAMPLE_SEED = 20260523
SAMPLE_SIZE = 400


@dataclass(frozen=True)
class Gpu:
    """The memory side of one rank: ``size_pool``'s arguments other than the inputs."""

    total_gpu_bytes: int = RTX_PRO_6000
    weight_bytes: int = 21 * GIB
    mem_fraction_static: float = 0.85
    other_static_bytes: int = 0
    preload_used_bytes: int = 0
    world_size: int = 1


def gpu_with_budget(budget_bytes: int, **kw: Any) -> Gpu:
    """A rank whose KV budget (``mfs * free-before-load - weights``) is about ``budget_bytes``."""
    gpu = Gpu(**kw)
    pre = gpu.total_gpu_bytes - gpu.preload_used_bytes
    return replace(gpu, weight_bytes=min(max(int(pre * gpu.mem_fraction_static) - budget_bytes, 0),
                                         pre))


def to_deployment(x: KVPoolInputs, gpu: Gpu) -> SglangDeployment:
    """The same rank as sglang sees it: resolved server args, env vars, free-memory readings."""
    env: dict[str, object] = {"SGLANG_DSV4_COMPRESS_STATE_DTYPE": x.compress_state_dtype}
    if x.online_c128:
        env["SGLANG_OPT_USE_ONLINE_COMPRESS"] = True
    if x.online_c128_mtp:
        env["SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"] = True
    pre_free = gpu.total_gpu_bytes - gpu.preload_used_bytes
    return SglangDeployment(
        num_hidden_layers=x.num_hidden_layers,
        compress_ratios=x.compress_ratios,
        pre_load_free_bytes=pre_free,
        profile_free_bytes=max(pre_free - gpu.weight_bytes - gpu.other_static_bytes, 0),
        mem_fraction_static=gpu.mem_fraction_static,
        qk_nope_head_dim=x.qk_nope_head_dim,
        qk_rope_head_dim=x.qk_rope_head_dim,
        index_head_dim=x.index_head_dim,
        window_size=x.sliding_window,
        context_len=x.context_length,
        kv_cache_dtype=x.kv_cache_dtype,
        page_size=x.page_size,
        enable_deepseek_v4_fp4_indexer=x.fp4_indexer,
        swa_full_tokens_ratio=x.swa_full_tokens_ratio,
        max_running_requests=x.max_running_requests,
        attn_dp_size=x.attn_dp_size,
        world_size=gpu.world_size,
        speculative_algorithm=x.speculative_algorithm,
        # The speculative hook's resolved value (DSpark: gamma + 1).
        speculative_num_draft_tokens=x.num_draft_tokens or None,
        hisparse_host_to_device_ratio=x.hisparse_host_to_device_ratio,
        disaggregation_mode=x.disaggregation_mode,
        disaggregation_decode_extra_slots=x.disaggregation_decode_extra_slots,
        max_total_tokens=x.max_total_tokens,
        env=env,
    )


def compare(x: KVPoolInputs, gpu: Gpu) -> tuple[list[str], SglangSizing]:
    """kvpool vs sglang for one rank: the list of differences (empty = equal) and sglang's side."""
    ref = oracle.run_sglang_sizing(to_deployment(x, gpu))
    got = K.size_pool(x, gpu.total_gpu_bytes, gpu.weight_bytes, gpu.mem_fraction_static,
                      gpu.other_static_bytes, preload_used_bytes=gpu.preload_used_bytes,
                      world_size=gpu.world_size)
    owned = {r for r in x.stage_ratios if r}
    pairs: list[tuple[str, object, object]] = [
        ("bytes_per_full_token", got.bytes_per_full_token, ref.bytes_per_full_token),
        ("bytes_per_swa_token", K.bytes_per_full_token(x).bytes_per_swa_token,
         ref.bytes_per_swa_token),
        ("fixed_bytes", got.fixed_bytes, ref.fixed_bytes),
        ("ring_sizes", {r: n for r, n in K.ring_sizes(x).items() if r in owned}, ref.ring_sizes),
        ("fits", got.fits, ref.failure is None),
    ]
    if ref.failure is None:
        pairs += [
            ("budget_bytes", got.budget_bytes, ref.available_bytes),
            ("max_total_num_tokens", got.max_total_num_tokens, ref.max_total_num_tokens),
            ("swa_tokens", got.swa_tokens, ref.swa_max_total_num_tokens),
            ("c4_tokens", got.c4_tokens, ref.c4_max_total_num_tokens),
            ("c128_tokens", got.c128_tokens, ref.c128_max_total_num_tokens),
            ("c4_state_slots", got.c4_state_slots, ref.c4_state_pool_size),
            ("c128_state_slots", got.c128_state_slots, ref.c128_state_pool_size),
            ("max_running_requests", got.max_running_requests, ref.max_running_requests),
        ]
    elif not (got.failure or "").startswith(ref.failure):
        pairs.append(("failure", got.failure, f"{ref.failure}..."))
    diffs = [f"{name}: kvpool={mine!r} sglang={theirs!r}"
             for name, mine, theirs in pairs if mine != theirs]
    return diffs, ref


def describe(x: KVPoolInputs, gpu: Gpu) -> str:
    """The non-default inputs of a case, for failure messages."""
    default = KVPoolInputs()
    changed = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)
               if getattr(x, f.name) != getattr(default, f.name)}
    return f"inputs={changed} gpu={gpu}"


# --- The installed sglang -------------------------------------------------------------------------


def test_installed_sglang_is_the_modelled_version() -> None:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None, "sglang missing: pip install --no-deps -r requirements/parsers.txt"
    assert importlib.metadata.version("sglang") == K.SGLANG_VERSION == oracle.SGLANG_VERSION
    assert oracle.sglang_root() == Path(next(iter(spec.submodule_search_locations or [])))


def test_v4_page_bytes_equals_kvlayout() -> None:
    """``kvpool.v4_page_bytes`` against the real ``KVLayout.V4.page_bytes``, 1-1024 tokens."""
    wrong = [(n, K.v4_page_bytes(n), oracle.kv_layout_page_bytes(n)) for n in range(1, 1025)
             if K.v4_page_bytes(n) != oracle.kv_layout_page_bytes(n)]
    assert not wrong, f"(tokens, kvpool, sglang) differ: {wrong[:5]}"


# --- Named corner cases ---------------------------------------------------------------------------

X = KVPoolInputs
EAGLE: SpecAlgorithm = "EAGLE"
DSPARK: SpecAlgorithm = "DSPARK"
BF16: StateDtype = "bfloat16"
DECODE: DisaggMode = "decode"
PREFILL: DisaggMode = "prefill"

#: (id, inputs, gpu, whether sglang starts): the expectation keeps each case testing its branch.
CORNERS: list[tuple[str, KVPoolInputs, Gpu, bool]] = [
    ("default", X(), Gpu(), True),
    ("fp4_indexer", X(fp4_indexer=True), Gpu(), True),
    ("bf16_state", X(compress_state_dtype=BF16), Gpu(), True),
    ("eagle_4", X(speculative_algorithm=EAGLE, speculative_num_draft_tokens=4), Gpu(), True),
    ("eagle_10_ring_limit", X(speculative_algorithm=EAGLE, speculative_num_draft_tokens=10),
     Gpu(), True),
    ("dspark_block_5", X(speculative_algorithm=DSPARK, dspark_block_size=5, draft_num_layers=3),
     Gpu(), True),
    ("dspark_fp4_bf16", X(speculative_algorithm=DSPARK, dspark_block_size=5, fp4_indexer=True,
                          compress_state_dtype=BF16), Gpu(), True),
    ("hisparse_2", X(hisparse_host_to_device_ratio=2), Gpu(), True),
    ("hisparse_4_eagle", X(hisparse_host_to_device_ratio=4, speculative_algorithm=EAGLE,
                           speculative_num_draft_tokens=3), Gpu(), True),
    ("attention_dp_8", X(attn_dp_size=8), Gpu(world_size=8), True),
    ("attention_dp_2_odd_mrr", X(attn_dp_size=2, max_running_requests=7), Gpu(world_size=2), True),
    ("tp8_float32_reads", X(), Gpu(world_size=8, preload_used_bytes=1_234_567_891), True),
    ("pd_decode_extra_slots", X(disaggregation_mode=DECODE, disaggregation_decode_extra_slots=16),
     Gpu(), True),
    ("pd_prefill", X(disaggregation_mode=PREFILL), Gpu(), True),
    ("online_c128", X(online_c128=True), Gpu(), True),
    ("online_c128_eagle_mtp", X(online_c128=True, online_c128_mtp=True,
                                speculative_algorithm=EAGLE, speculative_num_draft_tokens=4),
     Gpu(), True),
    ("max_total_tokens_cap", X(max_total_tokens=1_000_003), Gpu(), True),
    ("max_total_tokens_above_capacity", X(max_total_tokens=50_000_000), Gpu(), True),
    # No c128 layers (no fixed bytes), ~2.5 KB per token: 10 MB hold ~4,000 tokens < 2 * 4096.
    ("requests_capped_by_tokens", X(num_hidden_layers=3, max_running_requests=4096,
                                    swa_full_tokens_ratio=1.0), gpu_with_budget(10_000_000), True),
    ("stage_without_c128", X(num_hidden_layers=3), Gpu(), True),
    ("stage_without_compression", X(num_hidden_layers=2), Gpu(), True),
    ("revision_with_extra_ratios", X(num_hidden_layers=43,
                                     compress_ratios=(*DSV4_FLASH_COMPRESS_RATIOS, 0, 0)),
     Gpu(), True),
    ("swa_ratio_1", X(swa_full_tokens_ratio=1.0), Gpu(), True),
    # 0.013 * full must exceed window + page = 384 tokens: ~29,500 full tokens, ~210 MB + fixed.
    ("swa_pool_too_small", X(swa_full_tokens_ratio=0.013),
     gpu_with_budget(K.fixed_bytes(X()).total + 150_000_000), False),
    ("swa_pool_just_fits", X(swa_full_tokens_ratio=0.013),
     gpu_with_budget(K.fixed_bytes(X()).total + 300_000_000), True),
    ("weights_exceed_static_budget", X(), Gpu(weight_bytes=90 * GIB), False),
]


@pytest.mark.parametrize(("inputs", "gpu", "starts"), [c[1:] for c in CORNERS],
                         ids=[c[0] for c in CORNERS])
def test_corner_case_matches_sglang(inputs: KVPoolInputs, gpu: Gpu, starts: bool) -> None:
    diffs, ref = compare(inputs, gpu)
    assert not diffs, f"kvpool differs from sglang 0.5.23 for {describe(inputs, gpu)}:\n" + \
        "\n".join(diffs)
    assert (ref.failure is None) == starts, f"case no longer exercises its branch: {ref.failure}"


# --- Seeded random sample -------------------------------------------------------------------------


def random_case(rng: random.Random) -> tuple[KVPoolInputs, Gpu]:
    """One valid deployment: the inputs kvpool accepts, and a budget from negative to ~180 GiB."""
    layers = rng.choice([43, 43, 43, 44, 10, 3, 2, 1])
    ratios = DSV4_FLASH_COMPRESS_RATIOS + (0,) * max(0, layers - 43)
    algo: SpecAlgorithm | None = rng.choice([None, None, EAGLE, DSPARK])
    drafts = rng.randint(2, 10) if algo else None
    dspark_block = None
    if algo == DSPARK and rng.random() < 0.5:
        dspark_block, drafts = rng.randint(1, 9), None
    online = rng.random() < 0.2 and algo in (None, EAGLE)
    state: StateDtype = rng.choice(["float32", "bfloat16"])
    disagg: DisaggMode = rng.choice(["null", "prefill", "decode"])
    dp = rng.choice([1, 1, 2, 4, 8])
    x = KVPoolInputs(
        num_hidden_layers=layers,
        compress_ratios=ratios,
        fp4_indexer=rng.random() < 0.5,
        compress_state_dtype=state,
        swa_full_tokens_ratio=rng.choice([0.1, 0.1, 0.05, 0.2, 0.5, 1.0, 0.013, 0.3333, 0.07]),
        max_running_requests=rng.choice([1, 7, 48, 64, 256, 256, 1024, 4096, 4096]),
        attn_dp_size=dp,
        speculative_algorithm=algo,
        speculative_num_draft_tokens=drafts,
        dspark_block_size=dspark_block,
        online_c128=online,
        online_c128_mtp=online and algo == EAGLE,
        hisparse_host_to_device_ratio=rng.choice([None, None, 2, 4]),
        disaggregation_mode=disagg,
        disaggregation_decode_extra_slots=rng.choice([0, 0, 16]),
        max_total_tokens=rng.choice([None, None, None, rng.randint(1, 12_000_000)]),
    )
    # The KV budget sglang will see (mfs * free-before-load - weights - other), chosen first.
    # Near the edges: about as many full tokens as the SWA floor needs ((window + page) / ratio),
    # or (when more) fewer than 2 * requests, where resolve_max_num_reqs caps the requests.
    floor = (x.sliding_window + x.page_size) / x.swa_full_tokens_ratio
    reqs_edge = 2 * x.requested_running_requests_per_worker
    if reqs_edge > 1.05 * floor and rng.random() < 0.7:
        edge_tokens = rng.uniform(1.05 * floor, reqs_edge)
    else:
        edge_tokens = rng.uniform(0.5, 1.5) * floor
    edge = K.fixed_bytes(x).total + int(edge_tokens * K.bytes_per_full_token(x).total)
    target = rng.choice([rng.randint(-GIB, 2 * GIB), rng.randint(0, 8 * GIB),
                         rng.randint(0, 160 * GIB), edge])
    preload = rng.choice([0, rng.randint(0, 3 * GIB)])
    mfs = round(rng.uniform(0.5, 0.95), 3)
    # A card big enough for the target (the fixed bytes of 4096 requests exceed any real GPU).
    total = max(rng.randint(24 * GIB, 192 * GIB), int((target + GIB) / mfs) + preload)
    other = rng.choice([0, 0, rng.randint(0, GIB)])
    pre = total - preload
    weights = min(max(int(pre * mfs) - target - other, 0), pre)
    world = max(dp, rng.choice([1, 1, 2, 8]))
    return x, Gpu(total, weights, mfs, other, preload, world)


def test_random_sample_matches_sglang() -> None:
    rng = random.Random(SAMPLE_SEED)
    bad: list[str] = []
    seen: dict[str, int] = {}
    for i in range(SAMPLE_SIZE):
        x, gpu = random_case(rng)
        diffs, ref = compare(x, gpu)
        if diffs:
            bad.append(f"#{i} {describe(x, gpu)}\n  " + "\n  ".join(diffs))
        features = {
            "starts": ref.failure is None,
            "swa_too_small": "SWA pool" in (ref.failure or ""),
            "no_kv_memory": "Loaded weights" in (ref.failure or ""),
            "eagle": x.speculative_algorithm == EAGLE,
            "dspark": x.speculative_algorithm == DSPARK,
            "fp4_indexer": x.fp4_indexer,
            "bf16_state": x.compress_state_dtype == BF16,
            "hisparse": x.hisparse_host_to_device_ratio is not None,
            "attention_dp": x.attn_dp_size > 1,
            "float32_reads": gpu.world_size > 1,
            "pd_decode_extra": x.disaggregation_mode == DECODE
            and x.disaggregation_decode_extra_slots > 0,
            "online_c128": x.online_c128,
            "online_c128_mtp": x.online_c128_mtp,
            "token_cap_applied": ref.failure is None and x.max_total_tokens is not None
            and x.max_total_tokens < (ref.max_total_num_tokens or 0) + x.page_size,
            "requests_capped": ref.failure is None
            and (ref.max_running_requests or 0) < x.requested_running_requests_per_worker,
            "no_c128_layers": x.n_c128 == 0,
        }
        for name, hit in features.items():
            seen[name] = seen.get(name, 0) + bool(hit)
    assert not bad, f"{len(bad)}/{SAMPLE_SIZE} deployments differ from sglang 0.5.23:\n" + \
        "\n".join(bad[:8])
    thin = {name: n for name, n in seen.items() if n < 5}
    assert not thin, f"the sample no longer exercises these branches (<5 hits): {thin}"


# --- The comparison can fail ----------------------------------------------------------------------


def test_perturbed_page_align_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong FlashMLA page alignment (512 instead of 576) must show up as a difference."""
    assert not compare(X(), Gpu())[0]
    monkeypatch.setattr(K, "V4_PAGE_ALIGN", 512)
    diffs, _ = compare(X(), Gpu())
    assert any(d.startswith("bytes_per_full_token:") for d in diffs), diffs
    assert any(d.startswith("max_total_num_tokens:") for d in diffs), diffs


def test_perturbed_request_slots_are_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forgetting sglang's spare request slot (requests + 1) must change fixed bytes and state."""
    real = K.num_req_slots
    monkeypatch.setattr(K, "num_req_slots", lambda x, reqs: real(x, reqs) - 1)
    diffs, _ = compare(X(), Gpu())
    assert any(d.startswith("fixed_bytes:") for d in diffs), diffs
    assert any(d.startswith("c128_state_slots:") for d in diffs), diffs


def test_perturbed_oracle_input_is_detected() -> None:
    """The oracle side is live too: a different ratio in sglang's inputs changes the answer."""
    x, gpu = X(), Gpu()
    ref = oracle.run_sglang_sizing(replace(to_deployment(x, gpu), swa_full_tokens_ratio=0.2))
    got = K.size_pool(x, gpu.total_gpu_bytes, gpu.weight_bytes, gpu.mem_fraction_static)
    assert ref.bytes_per_full_token != got.bytes_per_full_token
    assert ref.swa_max_total_num_tokens != got.swa_tokens


# --- Both sides reject the same impossible configurations ----------------------------------------


def _raw(env: Mapping[str, object] | None = None, **changes: Any) -> SglangDeployment:
    """A deployment kvpool cannot express: the default one with sglang-side changes."""
    base = to_deployment(X(), Gpu())
    return replace(base, env={**base.env, **(env or {})}, **changes)


@pytest.mark.parametrize(("kvpool_kwargs", "deployment", "sglang_says"), [
    (dict(speculative_algorithm=EAGLE, speculative_num_draft_tokens=11),
     _raw(speculative_algorithm="EAGLE", speculative_num_draft_tokens=11),
     "exceeds what the c4 compress state ring"),
    (dict(speculative_algorithm=DSPARK, dspark_block_size=5, online_c128=True),
     _raw(speculative_algorithm="DSPARK", speculative_num_draft_tokens=6,
          env={"SGLANG_OPT_USE_ONLINE_COMPRESS": True}),
     "online c128 does not support MTP"),
    (dict(speculative_algorithm=EAGLE, speculative_num_draft_tokens=4, online_c128=True),
     _raw(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4,
          env={"SGLANG_OPT_USE_ONLINE_COMPRESS": True}),
     "online c128 does not support MTP"),
], ids=["eagle_11_drafts", "online_c128_dspark", "online_c128_eagle_without_mtp_env"])
def test_both_reject(kvpool_kwargs: dict[str, object], deployment: SglangDeployment,
                     sglang_says: str) -> None:
    with pytest.raises(KVPoolError):
        KVPoolInputs(**kvpool_kwargs)  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match=sglang_says):
        oracle.run_sglang_sizing(deployment)


# --- A missing or re-shaped sglang fails, saying what moved ---------------------------------------


def test_wrong_version_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda _name: "0.5.24")
    with pytest.raises(SglangShapeError, match=r"installed sglang is 0\.5\.24"):
        oracle.sglang_root()


def test_missing_sglang_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(SglangShapeError, match="sglang is not installed"):
        oracle.sglang_root()


def test_moved_function_fails() -> None:
    path = oracle.sglang_root() / "srt/model_executor/pool_configurator.py"
    with pytest.raises(SglangShapeError, match=r"no longer defines DSV4PoolSizer"):
        oracle.extract(path, {"DSV4PoolConfigurator", "DSV4PoolSizer"})
    with pytest.raises(SglangShapeError, match=r"no longer defines class KVCacheConfigurator2"):
        oracle.extract(path, {"calculate_pool_sizes"}, in_class="KVCacheConfigurator2")


def test_new_runtime_read_fails() -> None:
    """An attribute or env var the sizing starts to read, and the oracle does not stub, fails."""
    with pytest.raises(SglangShapeError, match=r"get_schedule\(\)\.new_knob"):
        _ = oracle._Bag("get_schedule()").new_knob
    with pytest.raises(SglangShapeError, match=r"envs\.SGLANG_NOT_A_REAL_ENV"):
        _ = oracle._Envs({}, {}).SGLANG_NOT_A_REAL_ENV


@pytest.mark.parametrize(("file_key", "old", "new", "message"), [
    ("configurator", "def _get_c128_state_fixed_bytes(", "def _get_c128_fixed_bytes(",
     r"_get_c128_state_fixed_bytes"),
    ("pool", "def get_compress_state_ring_size(", "def get_ring_size(",
     r"deepseek_v4_memory_pool\.py no longer defines get_compress_state_ring_size"),
    ("configurator", "envs.SGLANG_DSV4_COMPRESS_STATE_DTYPE.get()",
     "envs.SGLANG_DSV4_STATE_DTYPE.get()", r"envs\.SGLANG_DSV4_STATE_DTYPE"),
    ("configurator", "get_schedule().max_running_requests // kvc.attn_dp_size",
     "get_schedule().max_running_requests_per_rank // kvc.attn_dp_size",
     r"get_schedule\(\)\.max_running_requests_per_rank"),
    ("kvc", "from sglang.srt.model_executor.pool_configurator import (",
     "from sglang.srt.model_executor.pool_configurators import (",
     r"imports sglang\.srt\.model_executor\.pool_configurators"),
], ids=["renamed_method", "renamed_function", "new_env_var", "new_server_arg", "moved_module"])
def test_reshaped_sglang_copy_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    file_key: str, old: str, new: str, message: str) -> None:
    """End to end: a copy of the real sources with one change fails with a message naming it."""
    root = oracle.sglang_root()
    for key, rel in oracle.SOURCE_FILES.items():
        text = (root / rel).read_text(encoding="utf-8")
        if key == file_key:
            assert old in text, f"{rel} no longer contains {old!r}: update this test"
            text = text.replace(old, new)
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    monkeypatch.setattr(oracle, "sglang_root", lambda: tmp_path)
    oracle.load_sources.cache_clear()
    try:
        with pytest.raises(SglangShapeError, match=message):
            oracle.run_sglang_sizing(to_deployment(X(), Gpu()))
    finally:
        oracle.load_sources.cache_clear()
