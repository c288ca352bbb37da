"""Secrets in rendered files: which names a profile may use, and how secret engine flags reach the
engine without being written anywhere (issue 19, Deliver 3).

Owns three rules, all enforced while rendering (so ``plan``, ``render``, ``diff`` and ``apply`` all
refuse the same profiles):

- A flag the version's flag snapshot marks ``"secret": true`` (``--api-key``, ``--admin-api-key``,
  ``--ssl-keyfile-password``; the router's ``--api-key``, ...) is refused in ``extra_args``, in any
  spelling argparse accepts (``--api-key X``, ``--api-key=X``, an abbreviation). Its value would
  otherwise land in the launch script, the plan, the release's ``profile.yaml``, every diff and the
  host's process list. The error names the field, shows the value redacted and says which secret to
  use instead.
- Such a flag is set from ``secrets:`` under the name :func:`secret_env_name` gives
  (``DSV4_SECRET_API_KEY``, ``DSV4_SECRET_ROUTER_API_KEY``, ...). The value lives only in the 0600
  ``secrets/<name>.env`` the unit reads (``EnvironmentFile=``). SGLang 0.5.23 and sglang-router
  0.3.2 read these flags from argv only (no environment form; ``--config`` wants a YAML file), so
  the launch script starts the engine's Python with a fixed one-line shim (:data:`SHIM`) that
  appends ``FLAG VALUE`` to ``sys.argv`` *inside* the process, from the environment, and calls the
  same entry point the console script would. The script, the unit and ``/proc/<pid>/cmdline`` (the
  process list) carry only the variable's name; the value is in the process environment, which
  only its user and root can read (``/proc/<pid>/environ`` is 0400). SGLang 0.5.23 logs its
  parsed ``server_args`` at startup with ``api_key`` in clear (``engine.py``:
  ``redact_watermark_secrets`` redacts watermark keys only): the shim also makes every log line
  that process formats through :mod:`logging` show ``<redacted>`` instead of the values. Not
  covered: a ``print`` of them, or a child process that formats its own logs (SGLang's scheduler
  processes are spawned and do not import the shim).
- A secret may not shadow what the renderer sets (``CUDA_VISIBLE_DEVICES``, the kernel switches, a
  role's ``env:``) nor the loader's and interpreter's variables (``PATH``, ``LD_*``, ``PYTHON*``):
  the secrets file is read after the env file, so it would silently win. ``DSV4_SECRET_*`` names
  that map to no secret flag are refused too (a typo would otherwise set nothing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from orchestrator.catalog.flags import FlagSpec, FlagTable, load_flag_table
from orchestrator.deployment import Deployment, RoleDeployment
from orchestrator.errors import RenderError

SECRET_PREFIX = "DSV4_SECRET_"
ROUTER_ENGINE = "sglang-router"

# Names the loader, the interpreter or the shell act on before the engine runs: a secret must not
# be able to change what runs.
_PROCESS_NAMES = re.compile(r"^(PATH|HOME|SHELL|IFS|ENV|BASH_ENV|LD_.*|PYTHON.*|DSV4_KERNELS.*|"
                            r"CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES)$")

# `python -c SHIM MODULE FUNCTION N FLAG1 ENV1 ... FLAGN ENVN ARGS...`: runs MODULE.FUNCTION() with
# sys.argv = [MODULE, *ARGS, FLAG1, $ENV1, ...]. Only names travel in the real argv. It also wraps
# logging.Formatter.format so every log line this process formats has the values replaced by
# <redacted>: SGLang 0.5.23 logs its server_args, api_key in clear, at startup (engine.py:311), and
# the unit appends stdout to <install_root>/logs/<role>.log.
SHIM = ("import functools, importlib, logging, os, sys; "
        "mod, fn, n = sys.argv[1], sys.argv[2], int(sys.argv[3]); "
        "pairs = sys.argv[4:4 + 2 * n]; "
        "vals = [v for v in (os.environ[e] for e in pairs[1::2]) if v]; "
        "sys.argv = [mod, *sys.argv[4 + 2 * n:], "
        "*[w for f, e in zip(pairs[::2], pairs[1::2]) for w in (f, os.environ[e])]]; "
        "fmt = logging.Formatter.format; "
        "logging.Formatter.format = lambda self, record: functools.reduce("
        "lambda text, v: text.replace(v, \"<redacted>\"), vals, fmt(self, record)); "
        "sys.exit(getattr(importlib.import_module(mod), fn)())")

# The Python entry points behind the programs argv.py renders: what `bin/sglang` and
# `python -m sglang_router.launch_router` call (sglang 0.5.23 console script: sglang.cli.main:main).
ENGINE_ENTRY = ("sglang.cli.main", "main")
ROUTER_ENTRY = ("sglang_router.launch_router", "main")


def secret_env_name(engine: str, spec: FlagSpec) -> str:
    """The ``secrets:`` name that sets ``spec`` (``--api-key`` -> ``DSV4_SECRET_API_KEY``; the
    router's -> ``DSV4_SECRET_ROUTER_API_KEY``)."""
    router = "ROUTER_" if engine == ROUTER_ENGINE else ""
    return f"{SECRET_PREFIX}{router}{spec.dest.upper()}"


def _tables(dep: Deployment) -> list[FlagTable]:
    tables = [load_flag_table(dep.engine_name, dep.engine_version)]
    if dep.router is not None:
        tables.append(load_flag_table(ROUTER_ENGINE, dep.router_version))
    return tables


def secret_flags(dep: Deployment) -> dict[str, tuple[str, FlagSpec]]:
    """Every secret name this deployment accepts: name -> (engine, flag)."""
    out: dict[str, tuple[str, FlagSpec]] = {}
    for table in _tables(dep):
        for spec in table.secret_options():
            if spec.nargs is None:  # one value: FLAG VALUE (list-valued ones have no mapping)
                out[secret_env_name(table.engine, spec)] = (table.engine, spec)
    return out


def refuse_secret_extra_args(dep: Deployment, role: RoleDeployment, field: str) -> None:
    """A secret flag in ``extra_args`` is an error naming the field, with the value redacted."""
    table = load_flag_table(dep.engine_name, dep.engine_version)
    for i, word in enumerate(role.extra_args):
        spec = table.secret_in(word)
        if spec is None:
            continue
        shown = (word.split("=", 1)[0] + "=<redacted>") if "=" in word else word
        value_note = ("" if "=" in word or i + 1 >= len(role.extra_args)
                      else f" and its value extra_args[{i + 1}] = <redacted>")
        name = secret_env_name(table.engine, spec)
        raise RenderError(
            f"{field}.extra_args[{i}] = {shown!r}{value_note}: {spec.name} is a secret; on the "
            "command line its value would be written into the launch script, the plan, the "
            "release's profile.yaml and every diff, and show in the host's process list",
            fix=f"remove it from extra_args and set it as a secret: secrets: {{{name}: {{env: "
                f"VAR}}}} (or {{file: PATH}}); dsv4ctl passes it to the engine from the 0600 "
                "secrets file")


def check_secret_names(dep: Deployment, rendered_env: Iterable[str]) -> None:
    """Refuse secret names that shadow rendered variables, or that look like a secret flag's name
    but map to none."""
    known = secret_flags(dep)
    rendered = set(rendered_env)
    for name in dep.secret_names:
        if name in rendered or _PROCESS_NAMES.match(name):
            raise RenderError(
                f"secrets.{name}: {name} is set by dsv4ctl or read by the loader/interpreter; the "
                "secrets file is read after the rendered environment, so the secret would "
                "silently override it",
                fix=f"rename the secret, or set the value through the profile field that "
                    f"renders {name}")
        if name == f"{SECRET_PREFIX}ROUTER_API_KEY" and f"{SECRET_PREFIX}API_KEY" in dep.secret_names:
            # sglang-router 0.3.2 has one key: the engines behind a router with a key of its own
            # receive that key, not theirs, and refuse every forwarded request (seen with the real
            # router: tests/integration/test_release_secrets.py::test_router_key_alone_guards_the_router)
            raise RenderError(
                f"secrets.{name}: set together with {SECRET_PREFIX}API_KEY; sglang-router "
                f"{dep.router_version} sends its one key to the engines it routes to, so engines "
                "holding another key would refuse every request it forwards",
                fix=f"drop {name}: with {SECRET_PREFIX}API_KEY alone the router takes the engines' "
                    f"key, for its clients and the engines alike; keep {name} alone only for "
                    "engines without a key of their own")
        if name.startswith(SECRET_PREFIX) and name not in known:
            raise RenderError(
                f"secrets.{name}: no secret flag of {dep.engine_name} {dep.engine_version}"
                + (f" or sglang-router {dep.router_version}" if dep.router else "")
                + " has this name",
                fix="use one of: " + (", ".join(sorted(known)) or "(none)"))


def strip_secret_args(dep: Deployment, words: list[str]) -> list[str]:
    """An engine command line as reported back (``/server_info``'s ``launch_command``) without
    the secret flags and their values: compared with the release, and printed, without them."""
    table = load_flag_table(dep.engine_name, dep.engine_version)
    out: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        spec = table.secret_in(w)
        if spec is not None:
            skip = "=" not in w and spec.takes_value
            continue
        out.append(w)
    return out


def command_line_difference(dep: Deployment, role: RoleDeployment, words: list[str]
                            ) -> str | None:
    """How an engine's running command line differs from the one this release renders for
    ``role`` (None: it does not). ``words``: the command line as the host reports it, whole or
    from its first flag (``/server_info``'s ``launch_command``, the process's ``/proc`` cmdline):
    the program (``sglang serve``, the simulator, the secrets shim's ``python -c``) is skipped up
    to the first ``--`` flag once the secret flags and their values are gone (the shim passes
    them first, by name). Secret flags come from the secrets file, not the release: neither
    compared nor shown. ``status`` and ``plan --live`` both ask here."""
    from orchestrator.render.argv import engine_argv

    running = strip_secret_args(dep, words)
    running = running[next((i for i, w in enumerate(running) if w.startswith("--")),
                           len(running)):]
    wanted = engine_argv(dep, role)
    if running == wanted:
        return None
    extra = sorted(set(running) - set(wanted))[:5]
    missing = sorted(set(wanted) - set(running))[:5]
    return f"only running: {extra or '-'}; only in release: {missing or '-'}"


def api_key_names(dep: Deployment) -> tuple[str | None, str | None]:
    """(the engines' key, the router's key): the ``secrets:`` names whose values a client sends as
    its bearer token to an engine and to the router, None where none is set. The router's is its
    own (``DSV4_SECRET_ROUTER_API_KEY``) or, without one, the engines' (:func:`secret_args`
    renders it so). Health checks, ``status`` and the fleet's worker-API calls all ask here."""
    engine_key, router_key = f"{SECRET_PREFIX}API_KEY", f"{SECRET_PREFIX}ROUTER_API_KEY"
    eng = engine_key if engine_key in dep.secret_names else None
    return eng, router_key if router_key in dep.secret_names else eng


def secret_args(dep: Deployment, engine: str) -> list[tuple[str, str]]:
    """(flag, secret name) pairs the profile sets for ``engine`` (``sglang`` or the router).

    The router's ``--api-key`` is the key it presents to the workers, so without a router key of
    its own it gets the engines' (``DSV4_SECRET_API_KEY``): otherwise every request it forwards
    would be refused with 401."""
    pairs = [(spec.name, name) for name, (eng, spec) in sorted(secret_flags(dep).items())
             if eng == engine and name in dep.secret_names]
    engine_key, router_key = f"{SECRET_PREFIX}API_KEY", f"{SECRET_PREFIX}ROUTER_API_KEY"
    if (engine == ROUTER_ENGINE and engine_key in dep.secret_names
            and router_key not in dep.secret_names):
        pairs.append(("--api-key", engine_key))
    return pairs


def shim_program(python: str, entry: tuple[str, str], pairs: list[tuple[str, str]]) -> list[str]:
    """The program words that run ``entry`` with the secret ``pairs`` appended in-process."""
    words = [python, "-c", SHIM, entry[0], entry[1], str(len(pairs))]
    for flag, name in pairs:
        words += [flag, name]
    return words
