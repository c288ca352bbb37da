"""The executor: runs a playbook's steps in order, journals each one, and handles failure.

Owns the failure semantics of apply (issue 4, shared research anchors A.2 #5-6):

- every step is journaled in the release record *as it happens* (start, end, result, error), and the
  record is rewritten on the host after each step;
- a failure in a step marked ``on_failure: rollback`` restores the last healthy release with the
  rollback playbook and its *own* timeout (Helm's shared timeout made rollbacks time out,
  helm#8675), verifies its health, and journals those steps as ``rollback:<step>``;
- Ctrl-C is caught: the interrupted step is journaled, the host is brought back to a whole state
  (the rollback playbook runs with further Ctrl-C deferred), the record says ``interrupted``;
- the host lock is released on every path (and by the kernel if we die anyway);
- the result names what was done, what was not, and the exact command to recover.

An apply runs in two phases (issue 23): :meth:`Runner.prepare` (the steps before the first
``on_failure: rollback`` one: preflight, upload, kernels) and :meth:`Runner.switch` (the rest), or
:meth:`Runner.cancel` when a fleet rollout stops before the host's wave; the single host runs both
at once. Past ~400 lines because apply, rollback and their failure paths share one journal and
one lock discipline; the seam, if it is split, is apply vs rollback.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.apply.context import Context, Outcome, role_units
from orchestrator.apply.playbook import Playbook, load_playbook
from orchestrator.apply.preflight import reconcile
from orchestrator.apply.steps import ACTIONS
from orchestrator.errors import ApplyFailed, DsvError, Interrupted, RemoteError
from orchestrator.kernel_paths import served_by
from orchestrator.release.record import ReleaseRecord, rollback_target, utcnow


@dataclass
class Result:
    """What an apply or rollback did, for the CLI to print."""

    release: str | None
    status: str  # healthy | no-changes | failed | rolled-back | rollback-failed | interrupted
    message: str
    done: list[str] = field(default_factory=list)
    not_done: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    recovery: str | None = None
    rolled_back_to: str | None = None
    # where clients connect now (planner.endpoints.Endpoint): set when the host ends healthy on
    # a release or has nothing to change, from the deployment it serves; what the run's end
    # prints, one host or a fleet
    endpoints: list[Any] = field(default_factory=list)


class _StepError(Exception):
    def __init__(self, step: str, on_failure: str, cause: BaseException) -> None:
        super().__init__(step)
        self.step = step
        self.on_failure = on_failure
        self.cause = cause


@contextlib.contextmanager
def deferred_sigint(out: Callable[[str], None]) -> Iterator[None]:
    """While restoring a release, a second Ctrl-C must not leave the host half-switched: note it and
    carry on (the kernel lock still protects the host if the user kills us harder)."""
    try:
        previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, lambda *_: out("  (Ctrl-C ignored: finishing the rollback "
                                                    "so the host is left serving)"))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_playbook(pb: Playbook, ctx: Context, *, start: int = 0, end: int | None = None
                 ) -> str | None:
    """Run the steps; return a finish message if a step ended the playbook early. Raises
    ``_StepError`` (failure or KeyboardInterrupt) after journaling the remaining steps as not
    run."""
    n = len(pb.steps)
    rec = ctx.record
    for i, step in enumerate(pb.steps[start:end], start=start):
        name = ctx.journal_prefix + step.name
        entry = None
        outcome: Outcome | None = None
        # The journal write is part of the step (issue 20 #1): a record that cannot be written -
        # dropped connection, full disk - fails the step like its own work failing would, so a
        # failure right after the switch still ends in a rollback, never in a half-switched host
        # whose journal stops at "switch: running".
        try:
            if step.when is not None:
                ok, why = ctx.condition(step.when)
                if not ok:
                    if rec is not None:
                        entry = rec.begin(name, ctx.now())
                        rec.finish(entry, "skipped", ctx.now(), detail=why)
                    ctx.out(f"[{i + 1}/{n}] {name}: skipped ({why})")
                    outcome = Outcome(result="skipped", detail=why)
                    ctx.save_record()
                    continue
            ctx.out(f"[{i + 1}/{n}] {name}: {step.description}")
            entry = rec.begin(name, ctx.now()) if rec is not None else None
            ctx.save_record()
            outcome = ACTIONS[step.action](ctx, step)
            if rec is not None and entry is not None:
                rec.finish(entry, "ok" if outcome.result == "ok" else "skipped", ctx.now(),
                           detail=outcome.detail)
            if outcome.detail:
                ctx.out(f"  {outcome.detail}")
            ctx.save_record()
        except (Exception, KeyboardInterrupt) as exc:
            # Any exception, not only ours: an unexpected error after the switch must still end
            # in a rollback and a journaled terminal state, never a half-switched host.
            interrupted = isinstance(exc, KeyboardInterrupt)
            error = "interrupted (Ctrl-C)" if interrupted else _msg(exc)
            if outcome is not None and not interrupted:
                error = (f"the step's work was done ({outcome.detail or 'ok'}) but its journal "
                         f"could not be written: {error}")
            if rec is not None:
                if entry is None:
                    entry = rec.begin(name, ctx.now())
                rec.finish(entry, "interrupted" if interrupted else "failed", ctx.now(),
                           error=error)
                # every later step of the playbook, not only of this call's part: the
                # playbook ends here
                for later in pb.steps[i + 1:]:
                    rec.journal.append(type(entry)(step=ctx.journal_prefix + later.name,
                                                   start=entry.end or "", end=entry.end,
                                                   result="not-run"))
            ctx.out(f"  {'interrupted' if interrupted else 'FAILED'}: "
                    f"{'Ctrl-C' if interrupted else error}")
            raise _StepError(step.name, step.on_failure, exc) from exc
        if outcome.finish:
            return outcome.finish
    return None


def _msg(exc: BaseException) -> str:
    if isinstance(exc, DsvError):
        return exc.message
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    return f"unexpected {type(exc).__name__}: {exc}"


def _answers(ctx: Context) -> bool:
    """One real round trip. paramiko's ``is_active`` flag lags a connection whose sshd was killed
    (its reader thread has not seen EOF yet on a loaded controller), so it cannot be trusted after
    a transfer just failed: CI saw the record write go down the dead connection that way."""
    try:
        return ctx.remote.run("true", timeout=10.0).rc == 0
    except (DsvError, OSError):
        return False


def _reconnect(ctx: Context) -> bool:
    """After a dropped connection: reconnect and retake the lock so the record can be written.
    Returns False if the host stays unreachable or someone else took the lock meanwhile."""
    if ctx.remote.alive and (ctx.lock is None or ctx.lock.held) and _answers(ctx):
        return True
    from orchestrator.remote.lock import HostLock

    if ctx.lock is not None:
        with contextlib.suppress(Exception):
            ctx.lock.release()
    with contextlib.suppress(Exception):
        ctx.remote.close()
    try:
        ctx.remote.connect()
        ctx.lock = HostLock(ctx.remote, ctx.host.install_root, ctx.command + " (recording)",
                            outer=ctx.fleet_lock)
        ctx.lock.acquire()
        return True
    except DsvError as exc:
        ctx.out(f"  cannot reach the host again to record the outcome: {exc.message}")
        return False


def _summary(rec: ReleaseRecord | None) -> tuple[list[str], list[str]]:
    if rec is None:
        return [], []
    done = [f"{e.step}: {e.detail}" if e.detail else e.step for e in rec.journal
            if e.result in ("ok", "skipped")]
    not_done = [f"{e.step} ({e.result}{': ' + e.error if e.error else ''})" for e in rec.journal
                if e.result in ("failed", "interrupted", "not-run", "running")]
    return done, not_done


def _endpoints(ctx: Context) -> list[Any]:
    """Where clients connect to the release the host now serves (its deployment)."""
    from orchestrator.planner.endpoints import endpoints

    return endpoints(ctx.deployment, ctx.host.address) if ctx.deployment else []


def _with_endpoints(message: str, eps: list[Any]) -> str:
    """A healthy (or no-change) end's message, then its endpoints: what one host's run prints
    last."""
    from orchestrator.planner.endpoints import endpoint_lines

    return "\n".join([message, *endpoint_lines(eps)])


def restore(ctx: Context, target: str | None, reason: str, *, prefix: str = "rollback:"
            ) -> tuple[bool, str]:
    """Bring back ``target`` after a failed or interrupted apply or rollback (rollback playbook,
    own timeout), journaled into ``ctx.record`` as ``<prefix><step>``. Returns (restored and
    healthy, what happened). A failed restore marks ``target`` as no longer healthy (issue 20 #7):
    its record must not keep offering it as a known-good release."""
    failed_release = ctx.target
    new_deployment = ctx.deployment
    if target is None:
        # First release on this host, or no healthy one left: take the failed release's units down
        # rather than leave a broken one half-running, and say so.
        units = list(role_units(new_deployment).values())
        with contextlib.suppress(DsvError):
            ctx.svc.stop(list(reversed(units)))
        return False, ("no earlier healthy release to roll back to; the new release's units were "
                       "stopped")
    ctx.out(f"Rolling back to {target} ({reason}); rollback budget {ctx.rollback_timeout_s:.0f}s")
    sub = Context(remote=ctx.remote, host_name=ctx.host_name, host=ctx.host, out=ctx.out,
                  now=ctx.now, command=ctx.command, lock=ctx.lock, record=ctx.record,
                  persist=ctx.persist, journal_prefix=prefix, target=target,
                  from_release=failed_release if ctx.switched else ctx.from_release,
                  from_files=ctx.target_files, from_deployment=new_deployment,
                  rollback_timeout_s=ctx.rollback_timeout_s, journal_strict=False)
    pb = load_playbook("rollback", set(ACTIONS))
    try:
        run_playbook(pb, sub)
    except _StepError as err:
        why = f"{prefix}{err.step} failed: {_msg(err.cause)}"
        mark_restore_failed(ctx, target, why)
        return False, f"rollback step {err.step} failed: {_msg(err.cause)}"
    finally:
        ctx.journal_error = sub.journal_error or ctx.journal_error
    return True, f"{target} restored and healthy ({sub.health or 'checks pass'})"


def mark_restore_failed(ctx: Context, release: str, why: str) -> None:
    """Record on ``release`` that putting it back failed: a failed event, and a release recorded
    healthy becomes ``unhealthy`` (an explicit ``dsv4ctl rollback`` to it may still retry it)."""
    from orchestrator.release.record import Event, stamp

    def change(rec: ReleaseRecord) -> None:
        if rec.status == "healthy":
            rec.status = "unhealthy"
        rec.events.append(Event(time=stamp(ctx.now()), kind="rollback-to", result="failed",
                                other=ctx.from_release if ctx.from_release != release else None,
                                detail=why[:500]))

    if ctx.record is not None and ctx.record.id == release:
        change(ctx.record)
        return
    try:
        rec = ctx.store.read_record(release)
        change(rec)
        ctx.store.write_record(rec)
    except (DsvError, ValueError) as exc:
        ctx.out(f"  (could not mark {release} as not restored: {exc})")


@dataclass
class Runner:
    """One host's apply (:meth:`prepare`, then :meth:`switch` or :meth:`cancel`) and rollback,
    as the driver (:mod:`.fleet_ops`) runs them."""

    out: Callable[[str], None]
    now: Callable[[], datetime] = utcnow

    @staticmethod
    def switch_step(pb: Playbook) -> int:
        """Index of the first step that may change what serves (``on_failure: rollback``): the
        steps before it (preflight, upload, kernels) are the prepare phase."""
        return next((i for i, s in enumerate(pb.steps) if s.on_failure == "rollback"),
                    len(pb.steps))

    def prepare(self, ctx: Context) -> Result | None:
        """Phase 1 of an apply: the steps before the first that may change what serves
        (``playbooks/apply.yaml``: preflight, upload, kernels into ``releases/<id>/kernels/``).
        None: prepared, the release is on the host and its host lock stays held until
        :meth:`switch` or :meth:`cancel`. A Result: finished with nothing serving changed (no
        changes, or a prepare step failed and is journaled); the lock is released. A failing
        preflight raises its error, as before the release exists."""
        from orchestrator.release.record import plan_id
        from orchestrator.release_ids import new_release_id

        assert ctx.plan is not None and ctx.profile is not None
        pb = load_playbook("apply", set(ACTIONS))
        ctx.rollback_timeout_s = float(ctx.profile.rollout.rollback_timeout_s)
        pid = plan_id(ctx.plan)
        host = ctx.host_name
        prepared = False
        try:
            # preflight runs before the release (and its record) exists; its journal entry is
            # kept in memory and written with the record
            # a placeholder, not a release id yet: constructed, not validated (the id grammar is
            # for records read back from a host)
            ctx.record = ReleaseRecord.model_construct(
                id="pending", created="", host=host, deployment=ctx.plan.deployment.name,
                profile_name=ctx.plan.profile_name, plan_id=pid,
                base_release=ctx.plan.current_release,
                kernel_paths={r.name: served_by(r) for r in ctx.plan.deployment.roles
                              if r.kernels})
            try:
                finish = run_playbook(pb, ctx, end=1)
            except _StepError as err:
                raise err.cause from None
            if finish:  # nothing to change: it still ends with where clients connect
                eps = _endpoints(ctx)
                return Result(None, "no-changes", _with_endpoints(finish, eps), endpoints=eps)
            now = self.now()
            ctx.target = new_release_id([r.id for r in ctx.records], now, pid)
            ctx.record = ctx.record.model_copy(update={
                "id": ctx.target, "created": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "base_release": ctx.from_release,
                # what really happened, not the plan: filled in as the start step starts units
                # (Context.save_record); a release that fails before it restarted nothing
                "restarted_roles": [],
                "user": _who()[0],
                "controller": _who()[1]})
            ctx.persist = True
            ctx.save_record()
            self.out(f"Release {ctx.target} (base {ctx.from_release or 'none'})")
            try:
                run_playbook(pb, ctx, start=1, end=self.switch_step(pb))
            except _StepError as err:
                return self._after_failure(ctx, err)
            prepared = True
            return None
        finally:
            if not prepared and ctx.lock is not None:
                ctx.lock.release()

    def switch(self, ctx: Context) -> Result:
        """Phase 2 of an apply prepared by :meth:`prepare`: stop, switch, units, start, health,
        smoke, measure, qualify, record; a failure restores the last healthy release. Releases
        the host lock."""
        pb = load_playbook("apply", set(ACTIONS))
        try:
            try:
                run_playbook(pb, ctx, start=self.switch_step(pb))
            except _StepError as err:
                return self._after_failure(ctx, err)
            done, _ = _summary(ctx.record)
            eps = _endpoints(ctx)
            return Result(ctx.target, "healthy", _with_endpoints(
                f"Apply complete: {ctx.target} is healthy.", eps), done=done, endpoints=eps)
        finally:
            if ctx.lock is not None:
                ctx.lock.release()

    def cancel(self, ctx: Context, why: str) -> Result:
        """An apply prepared by :meth:`prepare` that will not be switched (its fleet rollout
        stopped before this host's wave): nothing serving changed. The release stays on disk
        (``keep_releases`` prunes it), its record says ``failed`` with ``why``, the lock is
        released."""
        rec = ctx.record
        try:
            if rec is not None:
                pb = load_playbook("apply", set(ACTIONS))
                now = ctx.now()
                entry = rec.begin("fleet", now)
                rec.finish(entry, "failed", now, error=f"not switched: {why}")
                for later in pb.steps[self.switch_step(pb):]:
                    rec.journal.append(type(entry)(step=later.name, start=entry.start,
                                                   end=entry.end, result="not-run"))
                rec.status = "failed"
            unsaved = _save_final(ctx)
            done, not_done = _summary(rec)
            return Result(ctx.target, "failed", f"not switched: {why}; nothing serving was "
                          f"changed ({ctx.from_release or 'no release'} is still current)"
                          + unsaved, done=done, not_done=not_done)
        finally:
            if ctx.lock is not None:
                ctx.lock.release()

    def _after_failure(self, ctx: Context, err: _StepError) -> Result:
        rec = ctx.record
        assert rec is not None and ctx.profile is not None
        ctx.journal_strict = False  # from here on, restoring matters more than the journal
        interrupted = isinstance(err.cause, KeyboardInterrupt)
        host = ctx.host_name
        what = "interrupted (Ctrl-C)" if interrupted else _msg(err.cause)
        if isinstance(err.cause, RemoteError) and not _reconnect(ctx):
            # the record kept here is the run's last word: its final status (nothing restored:
            # the host could not be reached) with the failed step's real error, which the next
            # run puts on the host (preflight.reconcile), never "applying"
            rec.status = "failed" if err.on_failure == "abort" else "interrupted"
            done, not_done = _summary(rec)
            local = _save_local(rec)
            return Result(ctx.target, "failed", f"{err.step} failed: {what}; the host could not "
                          f"be reached again, so the journal was saved here: {local}",
                          done=done, not_done=not_done,
                          recovery=f"dsv4ctl status --host {host}")
        restored, how = True, ""
        target = None
        if err.on_failure == "rollback":
            if not ctx.profile.rollout.rollback_on_failure and not interrupted:
                restored, how = False, "automatic rollback is off (rollout.rollback_on_failure)"
            else:
                records = ctx.store.read_records()
                target = rollback_target(records, ctx.from_release, failed=ctx.target)
                rec.rollback_target = target
                ctx.save_record()
                with deferred_sigint(self.out):
                    restored, how = restore(ctx, target, f"{err.step} {what}")
        else:
            with contextlib.suppress(DsvError):
                ctx.store.clean_temp()
        if restored and err.on_failure == "rollback":
            # keep_releases applies after failures too: failed attempts must not pile up, and the
            # restored release (current) and the last healthy one are never pruned
            with contextlib.suppress(DsvError):
                ctx.store.prune(ctx.profile.rollout.keep_releases, last_healthy=target)
        if interrupted:
            rec.status = "interrupted"
        elif err.on_failure == "abort":
            rec.status = "failed"
        else:
            rec.status = "rolled-back" if restored else "rollback-failed"
        unsaved = _save_final(ctx)
        done, not_done = _summary(rec)
        if err.on_failure == "abort":
            msg = (f"{err.step} {what}; nothing serving was changed "
                   f"({ctx.from_release or 'no release'} is still current)")
            recovery = f"fix the cause, then re-run: {ctx.command}"
            status = "interrupted" if interrupted else "failed"
        elif restored:
            msg = f"{err.step} {what}; rolled back: {how}"
            recovery = f"dsv4ctl history --host {host}   # then fix the profile and re-apply"
            status = "interrupted" if interrupted else "rolled-back"
        else:
            msg = f"{err.step} {what}; rollback failed: {how}"
            recovery = (f"dsv4ctl rollback {target} --host {host}" if target else
                        f"dsv4ctl status --host {host}   # nothing healthy to roll back to")
            status = "interrupted" if interrupted else "rollback-failed"
        return Result(ctx.target, status, msg + unsaved, done=done, not_done=not_done,
                      recovery=recovery, rolled_back_to=target if restored else None)

    def rollback(self, ctx: Context, target: str) -> Result:
        """Explicit ``dsv4ctl rollback``: journaled into the target's record as rollback:<step>.
        When it fails after changing the host, the last healthy release (other than the target)
        is put back (journaled as fallback:<step>); when it fails before changing anything, the
        host is as it was and the result says so (exit 1, not 4: issue 20 #4, #9)."""
        from orchestrator.remote.lock import HostLock

        ctx.lock = HostLock(ctx.remote, ctx.host.install_root, ctx.command, outer=ctx.fleet_lock)
        ctx.lock.acquire()
        try:
            reconcile(ctx)
            ctx.from_release = ctx.store.current()
            # a current release whose directory was removed by hand is drift, not a reason to
            # refuse: the rollback goes on from "no known files" (its units restart)
            if ctx.from_release is not None and ctx.store.exists(ctx.from_release):
                from orchestrator.apply.context import load_release

                ctx.from_files, ctx.from_deployment, prof = load_release(ctx.store,
                                                                         ctx.from_release)
                ctx.rollback_timeout_s = float(prof.rollout.rollback_timeout_s)
            ctx.target = target
            ctx.record = ctx.store.read_record(target)
            ctx.persist = True
            ctx.journal_prefix = "rollback:"
            ctx.journal_strict = False
            pb = load_playbook("rollback", set(ACTIONS))
            try:
                with deferred_sigint(self.out):
                    run_playbook(pb, ctx)
            except _StepError as err:
                return self._rollback_failed(ctx, target, err)
            eps = _endpoints(ctx)  # the target's deployment (the rollback's preflight read it)
            return Result(target, "healthy", _with_endpoints(
                f"Rolled back: {target} is current and healthy.", eps),
                rolled_back_to=target, endpoints=eps)
        finally:
            ctx.lock.release()

    def _rollback_failed(self, ctx: Context, target: str, err: _StepError) -> Result:
        rec = ctx.record
        assert rec is not None
        host = ctx.host_name
        what = f"rollback to {target} failed at {err.step}: {_msg(err.cause)}"
        changed = bool(ctx.stopped) or ctx.switched or bool(ctx.started)
        if not changed:
            # refused before anything was stopped or switched: the host is as it was
            rec.events.append(_failed_event(ctx, f"refused at {err.step}: {_msg(err.cause)}"))
            unsaved = _save_final(ctx)
            done, not_done = _summary(rec)
            return Result(target, "failed", f"{what}; nothing was changed "
                          f"({ctx.from_release or 'no release'} is still current)" + unsaved,
                          done=done, not_done=not_done,
                          recovery=f"dsv4ctl history --host {host}   # pick another release")
        if isinstance(err.cause, RemoteError) and not _reconnect(ctx):
            rec.events.append(_failed_event(ctx, f"{what}; the host could not be reached again"))
            done, not_done = _summary(rec)
            return Result(target, "rollback-failed", f"{what}; the host could not be reached "
                          f"again, so the journal was saved here: {_save_local(rec)}",
                          done=done, not_done=not_done, recovery=f"dsv4ctl status --host {host}")
        mark_restore_failed(ctx, target, f"rollback:{err.step} failed: {_msg(err.cause)}")
        fallback = rollback_target(ctx.store.read_records(), ctx.from_release, failed=target)
        restored, how = False, "no other healthy release to fall back to"
        if fallback is not None:
            with deferred_sigint(self.out):
                restored, how = restore(ctx, fallback, what, prefix="fallback:")
        unsaved = _save_final(ctx)
        done, not_done = _summary(rec)
        if restored:
            return Result(target, "rolled-back", f"{what}; fell back to {fallback}: {how}"
                          + unsaved, done=done, not_done=not_done, rolled_back_to=fallback,
                          recovery=f"dsv4ctl history --host {host}   # {target} is not usable")
        return Result(target, "rollback-failed", f"{what}; falling back failed too: {how}"
                      + unsaved, done=done, not_done=not_done,
                      recovery=(f"dsv4ctl rollback {fallback} --host {host}" if fallback
                                else f"dsv4ctl status --host {host}"))


def _failed_event(ctx: Context, detail: str) -> Any:
    from orchestrator.release.record import Event, stamp

    return Event(time=stamp(ctx.now()), kind="rollback-to", result="failed",
                 other=ctx.from_release, detail=detail[:500])


def _save_final(ctx: Context) -> str:
    """Write the record once more at the end; if the host cannot take it, keep it on the
    controller. Returns text for the result message ("" when saved on the host)."""
    if not (ctx.persist and ctx.record):
        ctx.journal_error = None
        return ""
    for attempt in range(2):
        try:
            ctx.store.write_record(ctx.record)
            ctx.journal_error = None
            return ""
        except RemoteError as exc:
            # the connection died under the write: one reconnect, then the local fallback
            failure = exc
            if attempt or not _reconnect(ctx):
                break
        except DsvError as exc:  # the host refused it (disk full, ...): retrying cannot help
            failure = exc
            break
    local = _save_local(ctx.record)
    return (f" (the record could not be written on the host: {failure.message}; "
            f"saved here: {local})")


def _save_local(rec: ReleaseRecord) -> str:
    """Last resort when the host cannot take the record (unreachable, disk full): keep the journal
    on the controller; the next apply or rollback puts it on the host (:func:`.preflight.reconcile`)."""
    from orchestrator.apply.preflight import local_record_path

    try:
        path = local_record_path(rec.host, rec.id)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # explicit mode, never through a planted link (issue 31): the journal names the host
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(rec.to_json())
    except (OSError, DsvError) as exc:
        return f"(could not save it either: {exc})"
    return str(path)


def _who() -> tuple[str, str]:
    import getpass
    import socket

    return getpass.getuser(), socket.gethostname()


def raise_for(result: Result) -> None:
    """Map a non-successful result to the documented exit codes (the CLI boundary prints it)."""
    if result.status in ("healthy", "no-changes"):
        return
    if result.status == "interrupted":
        raise Interrupted(result.message, fix=result.recovery)
    if result.status == "failed":
        raise DsvError(result.message, fix=result.recovery)
    raise ApplyFailed(result.message, rolled_back=result.status == "rolled-back",
                      fix=result.recovery)


__all__ = ["Result", "Runner", "raise_for", "reconcile", "restore", "run_playbook"]
