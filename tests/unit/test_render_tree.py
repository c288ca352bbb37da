"""The release tree: layout, modes, restart roles, determinism, manifest, resolved profile."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import RenderError
from orchestrator.profile.loader import load_text
from orchestrator.profile.schema import Profile
from orchestrator.render import render_release
from tests.validate.helpers import (
    INVENTORY,
    PROFILES,
    render_path,
    render_text,
    resolve_profile,
    shipped_profiles,
)


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_layout_modes_and_roles(path: Path) -> None:
    _, dep, tree = render_path(path)
    files = tree.files
    assert list(files) == sorted(files)
    for role in dep.roles:
        for rel in (f"units/{role.unit}", f"bin/launch-{role.name}.sh", f"env/{role.name}.env"):
            assert files[rel].roles == (role.name,), rel
        assert files[f"bin/launch-{role.name}.sh"].mode == 0o755
        assert files[f"units/{role.unit}"].mode == 0o644
    if dep.router is not None:
        assert files[f"units/{dep.router.unit}"].roles == ("router",)
        assert files["bin/launch-router.sh"].roles == ("router",)
    for rel in files:
        if rel.startswith("monitoring/") or rel == "profile.yaml":
            assert files[rel].roles == (), rel
    for rel, f in files.items():
        assert f.content.endswith("\n") and not f.content.endswith("\n\n"), rel
    assert "manifest.json" not in files and "manifest.json" in tree.all_files()


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_deterministic(path: Path) -> None:
    a = render_path(path)[2]
    b = render_path(path)[2]
    assert a.all_files() == b.all_files()
    assert a.digest() == b.digest()


def test_manifest_hashes_every_file() -> None:
    _, _, tree = render_path(PROFILES / "default.yaml")
    doc = json.loads(tree.manifest())
    assert doc["format"] == 1 and doc["deployment"] == "default"
    assert set(doc["files"]) == set(tree.files)
    for rel, entry in doc["files"].items():
        assert entry["sha256"] == hashlib.sha256(tree.files[rel].content.encode()).hexdigest()
        assert int(entry["mode"], 8) == tree.files[rel].mode


def test_write_sets_modes(tmp_path: Path) -> None:
    _, _, tree = render_path(PROFILES / "default.yaml")
    tree.write(tmp_path)
    for rel, f in tree.all_files().items():
        p = tmp_path / rel
        assert p.read_text() == f.content
        assert stat.S_IMODE(os.stat(p).st_mode) == f.mode, rel
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_resolved_profile_is_a_fixpoint(path: Path) -> None:
    """profile.yaml is itself applyable, and rendering it gives the very same tree."""
    _, dep, tree = render_path(path)
    resolved = load_text(Profile, tree.files["profile.yaml"].content, "profile.yaml")
    assert resolved.attention.index_topk == dep.index_topk
    again = render_release(resolved, resolve_profile(resolved))
    assert again.all_files() == tree.all_files()


def test_unit_wiring_pd() -> None:
    _, _, tree = render_path(PROFILES / "default.yaml")
    router = tree.files["units/dsv4-default-router.service"].content
    assert "After=dsv4-default-prefill.service dsv4-default-decode.service" in router
    assert "Wants=dsv4-default-prefill.service dsv4-default-decode.service" in router
    dec = tree.files["units/dsv4-default-decode.service"].content
    for line in ("Restart=on-failure", "TimeoutStartSec=300", "LimitNOFILE=1048576",
                 "EnvironmentFile=/srv/dsv4/current/env/decode.env",
                 "EnvironmentFile=-/srv/dsv4/secrets/default.env",
                 "ExecStart=/srv/dsv4/current/bin/launch-decode.sh",
                 "StandardOutput=append:/srv/dsv4/logs/decode.log",
                 "WantedBy=multi-user.target"):
        assert line in dec.splitlines(), line
    assert "secrets" not in router  # the router needs no secret
    env = tree.files["env/decode.env"].content
    assert 'CUDA_VISIBLE_DEVICES="4,5,6,7"' in env and 'DSV4_KERNELS_SGLANG="1"' in env


def test_user_scope_and_kernels_off() -> None:
    _, _, tree = render_path(PROFILES / "default.yaml", scope="user")
    unit = tree.files["units/dsv4-default-decode.service"].content
    assert "WantedBy=default.target" in unit and "network-online" not in unit
    assert "LimitNOFILE=" not in unit  # an unprivileged user manager cannot raise hard limits
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["kernels"] = {"enabled": False}
    _, _, tree = render_text(yaml.safe_dump(data))
    assert "DSV4_KERNELS_SGLANG" not in tree.files["env/decode.env"].content


def test_role_env_cannot_override_gpus() -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["topology"]["decode"]["env"] = {"CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(RenderError, match=r"topology\.decode\.env\.CUDA_VISIBLE_DEVICES"):
        render_text(yaml.safe_dump(data))


def test_role_env_is_rendered_sorted() -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["topology"]["decode"]["env"] = {"ZZ": "1", "NCCL_DEBUG": "INFO"}
    _, _, tree = render_text(yaml.safe_dump(data))
    lines = tree.files["env/decode.env"].content.splitlines()
    assert lines.index('NCCL_DEBUG="INFO"') < lines.index('ZZ="1"')


def test_description_edit_restarts_nothing() -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    a = render_text(yaml.safe_dump(data))[2]
    data["description"] = "another comment"
    b = render_text(yaml.safe_dump(data))[2]
    changed = [rel for rel in a.files if a.files[rel] != b.files[rel]]
    assert changed == ["profile.yaml"]


def test_extra_files_cannot_overwrite_or_escape() -> None:
    profile, dep, _ = render_path(PROFILES / "default.yaml")
    tree = render_release(profile, dep, extra_files={"plan.json": "{}"})
    assert tree.files["plan.json"].content == "{}\n" and tree.files["plan.json"].roles == ()
    for bad in ("profile.yaml", "manifest.json", "../x", "/etc/x"):
        with pytest.raises(RenderError):
            render_release(profile, dep, extra_files={bad: "x"})


def _env_with_kernels(kernels: dict[str, object], role: str = "decode") -> str:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["kernels"] = kernels
    _, _, tree = render_text(yaml.safe_dump(data))
    return tree.files[f"env/{role}.env"].content


def test_each_bundled_op_renders_its_routing_and_nothing_else() -> None:
    # per-op choices: the hook's op list names exactly the bundled ops, and each bundled op
    # brings the SGLang settings that route to the entry point the hook replaces
    env = _env_with_kernels({"attention": "bundled", "indexer": "engine", "mhc_pre": "engine"})
    assert 'DSV4_KERNELS_OPS="attention"' in env and 'SGLANG_SM120_FLASHMLA_BACKEND="triton"' in env
    assert "TILELANG" not in env and "PAGED_MQA" not in env
    env = _env_with_kernels({"attention": "engine", "indexer": "bundled", "mhc_pre": "bundled"})
    assert 'DSV4_KERNELS_OPS="indexer,mhc_pre"' in env
    assert 'SGLANG_OPT_USE_TILELANG_INDEXER="0"' in env
    assert 'SGLANG_FP8_PAGED_MQA_LOGITS_TORCH="1"' in env and "FLASHMLA" not in env
    off = _env_with_kernels({"attention": "engine", "indexer": "engine", "mhc_pre": "engine"})
    assert "DSV4_KERNELS" not in off and "SGLANG_" not in off


def test_the_old_single_switch_maps_onto_per_op_choices() -> None:
    # kernels.enabled: false meant "no bundled kernel" and still does; kernels.bf16_gemms: false
    # keeps the mHC pre GEMM on the engine; kernels.enabled: true no longer forces them (auto)
    assert "DSV4_KERNELS" not in _env_with_kernels({"enabled": False})
    assert "DSV4_KERNELS" not in _env_with_kernels({"enabled": True, "bf16_gemms": False})
    assert _env_with_kernels({"enabled": True}) == _env_with_kernels({})


def test_engine_imports_the_kernels_through_current() -> None:
    # issue 20 item 6: the kernels ship inside each release; the engine finds them through
    # `current`, so the switch and a rollback select them with the release
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    _, dep, _ = render_text(yaml.safe_dump(data))
    want = f'PYTHONPATH="{dep.install_root}/current/kernels"'
    assert want in _env_with_kernels({"attention": "bundled"})
    assert "PYTHONPATH" not in _env_with_kernels({"enabled": False})


def test_role_env_cannot_set_the_kernels_path() -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["topology"]["decode"]["env"] = {"PYTHONPATH": "/opt/x"}
    with pytest.raises(RenderError, match=r"decode\.env\.PYTHONPATH.*kernels\.mhc_pre: bundled"):
        render_text(yaml.safe_dump(data))


def test_the_switches_render_sets_are_the_ones_the_kernels_hook_reads() -> None:
    # two packages spell the names (orchestrator.render sets them, dsv4_kernels.sglang_hook reads
    # them; plan may not import the kernels): this pins that they agree
    from dsv4_kernels import sglang_hook

    from orchestrator.kernel_paths import OPS
    from orchestrator.render import HOOK_ENV, HOOK_OPS_ENV, LEGACY_BF16_GEMMS_ENV

    assert HOOK_ENV == sglang_hook.ENV_VAR and f"'{sglang_hook.ENV_VAR}'" in sglang_hook.PTH_LINE
    assert HOOK_OPS_ENV == sglang_hook.OPS_ENV and LEGACY_BF16_GEMMS_ENV == sglang_hook.BF16_GEMMS_ENV
    assert set(sglang_hook.OPS.values()) == set(OPS) and set(sglang_hook.OPS) == set(sglang_hook.TARGETS)


def test_role_env_cannot_set_a_routing_variable_of_a_bundled_op() -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["kernels"] = {"attention": "bundled"}
    data["topology"]["decode"]["env"] = {"SGLANG_SM120_FLASHMLA_BACKEND": "flashinfer"}
    with pytest.raises(RenderError, match=r"SGLANG_SM120_FLASHMLA_BACKEND.*kernels\.attention"):
        render_text(yaml.safe_dump(data))


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_apply_uploads_the_renderers_manifest(path: Path) -> None:
    """One writer of manifest.json: the tree apply uploads from a saved plan carries exactly the
    manifest `dsv4ctl render` writes (apply.context.tree_from_plan uses ReleaseTree.manifest)."""
    from orchestrator.apply.context import tree_from_plan
    from orchestrator.planner.fleet import load_fleet, plan_fleet, plan_from_paths

    fleet = load_fleet(path, INVENTORY)
    if fleet.is_fleet:  # a fleet is planned per host: each host's plan against its own render
        pairs = [(p, render_release(fleet.profile, p.deployment)) for p in plan_fleet(fleet).plans]
    else:
        pairs = [(plan_from_paths(path), render_path(path)[2])]
    assert pairs
    for plan, tree in pairs:
        files, hashes, manifest = tree_from_plan(plan)
        assert manifest == tree.manifest(), plan.host
        assert files["manifest.json"][0].decode() == tree.manifest()
        assert hashes == {p: f.sha256 for p, f in tree.files.items()}
