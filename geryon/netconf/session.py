"""Vendor switch sessions: each platform's own safety net around a rendered profile, shown or executed.

A `Session` is data: the steps that save the running state, apply the rendering, read it back, confirm it,
and the steps that roll back. `--dry-run` prints them; with an endpoint they run over SSH (`SshShell`,
host key checked), each step one exec channel with its script on stdin (how EOS `Cli`, Junos `cli`,
NX-OS and Cumulus shells take a multi-line session).

  sonic  `config checkpoint` -> `config apply-patch` with an RFC 6902 JSON patch computed from
         `show runningconfiguration all`, field by field: only the fields geryon owns (see
         geryon.netconf.render.sonic), never a whole PORT_QOS_MAP or QUEUE entry, whose other fields (PFC,
         watchdog, priority groups, WRED) are the platform's -> read back (geryon's fields as rendered, every
         other field as before) -> on failure `config apply-patch` with the exact inverse patch; the
         checkpoint stays for `config rollback` by hand (SONiC Generic Config Updater HLD: "config
         apply-patch / checkpoint / rollback")
  eos    `configure session` ... `commit timer 00:05:00` (reverts by itself unless confirmed) -> read back
         -> `configure session NAME commit`, or `abort` (EOS manual, "Configure Sessions")
  junos  `configure private` ... `commit confirmed 5` -> read back -> `commit`, or `rollback 1` + commit
         (Junos CLI User Guide, "commit confirmed")
  nxos   `checkpoint NAME` -> `configure terminal` ... -> read back -> on failure
         `rollback running-config checkpoint NAME` (NX-OS System Management Guide, "Rollback")
  nvue   note the applied revision (`nv config history`) -> `nv set ...` + `nv config apply -y` -> read
         back (`nv config show -o commands`) -> on failure `nv config apply <revision> -y`
         (Cumulus Linux User Guide, "NVUE ... Configuration Management")
OpenConfig is pushed with gNMI Set, which geryon does not speak: render it and use a gNMI client.
"""

import json
import re
from dataclasses import dataclass, field

from geryon.errors import ApplyError, ConfigError, GeryonError
from geryon.netconf.linuxapply import ApplyResult
from geryon.netconf.qos_profile import QosProfile
from geryon.netconf.remote import Endpoint, SshShell
from geryon.netconf.render import Rendering, render
from geryon.netconf.render.sonic import config_db

NAME = "geryon-qos"


@dataclass(frozen=True)
class Step:
    """One exec: `command`, with `stdin` fed to it."""

    name: str
    command: str
    stdin: str | None = None

    def show(self) -> str:
        text = f"## {self.name}\n$ {self.command}\n"
        return text + (self.stdin if self.stdin else "")


@dataclass
class Session:
    """The steps of one vendor change, in order."""

    kind: str
    save: list[Step] = field(default_factory=list)
    apply: list[Step] = field(default_factory=list)
    readback: Step | None = None
    confirm: list[Step] = field(default_factory=list)
    rollback: list[Step] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)  # lines the read-back must contain

    def show(self) -> str:
        parts = [s.show() for s in self.save + self.apply]
        if self.readback:
            parts.append(self.readback.show())
        parts += [s.show() for s in self.confirm]
        parts += ["## on failure"] + [s.show() for s in self.rollback]
        return "\n".join(parts)


def expected_lines(kind: str, lines: list[str]) -> list[str]:
    """The rendered lines as the platform's running configuration shows them (what read-back must find)."""
    if kind == "junos":  # `display set` shows one statement per element of a [ list ]
        out = []
        for line in lines:
            head, bracket, rest = line.partition(" [ ")
            out += [f"{head} {item}" for item in rest.rstrip(" ]").split()] if bracket else [line]
        return out
    if kind == "eos":  # strict priority and the identity tc -> tx-queue map are EOS defaults, not displayed
        return [line for line in lines if line.strip() != "priority strict"
                and not (line.startswith("qos map traffic-class ") and line.split()[3] == line.split()[-1])]
    return lines


def _script(lines) -> str:
    return "\n".join(lines) + "\n"


def json_patch(running: dict, desired: dict) -> list[dict]:
    """RFC 6902 operations giving `running` the fields of `desired` (table -> key -> field -> value).

    Field by field: an entry that exists keeps every field `desired` does not name (a port's pfc_enable,
    a queue's wred_profile); only a missing table or entry is added whole."""
    ops = []
    for table, entries in desired.items():
        if table not in running:
            ops.append({"op": "add", "path": f"/{_pointer(table)}", "value": entries})
            continue
        for key, fields in entries.items():
            path = f"/{_pointer(table)}/{_pointer(key)}"
            have = running[table].get(key)
            if not isinstance(have, dict):
                ops.append({"op": "add" if have is None else "replace", "path": path, "value": fields})
                continue
            for name, value in fields.items():
                if name not in have:
                    ops.append({"op": "add", "path": f"{path}/{_pointer(name)}", "value": value})
                elif have[name] != value:
                    ops.append({"op": "replace", "path": f"{path}/{_pointer(name)}", "value": value})
    return ops


def inverse_patch(running: dict, ops: list[dict]) -> list[dict]:
    """The RFC 6902 operations that undo `ops` applied to `running`: removes what they added, restores
    what they replaced, last first, so the rolled-back config equals `running` exactly."""
    undo = []
    for op in ops:
        old = _lookup(running, op["path"])
        if op["op"] == "add" and old is _MISSING:
            undo.append({"op": "remove", "path": op["path"]})
        elif op["op"] in ("add", "replace"):
            undo.append({"op": "replace", "path": op["path"], "value": old})
        else:
            raise ConfigError(f"cannot invert JSON patch operation {op['op']!r}")
    return undo[::-1]


def apply_patch(document: dict, ops: list[dict]) -> dict:
    """`document` with RFC 6902 add/replace/remove `ops` applied (a copy; objects only, as config_db is)."""
    doc = json.loads(json.dumps(document))
    for op in ops:
        *parents, last = _tokens(op["path"])
        node = doc
        for token in parents:
            if not isinstance(node, dict) or token not in node:
                raise ConfigError(f"JSON patch path {op['path']} does not exist")
            node = node[token]
        if op["op"] == "remove" or (op["op"] == "replace" and last not in node):
            if last not in node:
                raise ConfigError(f"JSON patch {op['op']} of {op['path']}, which does not exist")
        if op["op"] == "remove":
            del node[last]
        else:
            node[last] = json.loads(json.dumps(op["value"]))
    return doc


_MISSING = object()


def _lookup(document: dict, path: str):
    node = document
    for token in _tokens(path):
        if not isinstance(node, dict) or token not in node:
            return _MISSING
        node = node[token]
    return node


def _tokens(path: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _patch_step(name: str, ops: list[dict]) -> Step:
    return Step(name, f"cat > /tmp/{NAME}.json-patch && sudo config apply-patch /tmp/{NAME}.json-patch",
                json.dumps(ops, indent=1) + "\n")


def build_session(profile: QosProfile, rendering: Rendering, running: dict | None = None) -> Session:
    """The session for `rendering`'s target; SONiC's patch is computed from `running` (None: empty)."""
    kind = rendering.target
    lines = list(rendering.commands)
    if kind == "sonic":
        running = running or {}
        patch = json_patch(running, config_db(profile))
        return Session(kind, save=[Step("save: checkpoint", f"sudo config checkpoint {NAME}")],
                       apply=[_patch_step("apply: JSON patch from the running config, field by field", patch)]
                       if patch else [],
                       readback=Step("read back", "show runningconfiguration all"),
                       confirm=[Step("drop the checkpoint", f"sudo config delete-checkpoint {NAME}")],
                       rollback=[_patch_step("roll back: the inverse patch", inverse_patch(running, patch))])
    if kind == "eos":
        return Session(kind, save=[Step("save: running config", "show running-config")],
                       apply=[Step("apply in a session with a commit timer", "Cli -p 15",
                                   _script([f"configure session {NAME}", *lines, "commit timer 00:05:00"]))],
                       readback=Step("read back", "show running-config"),
                       confirm=[Step("confirm", "Cli -p 15", _script([f"configure session {NAME} commit"]))],
                       rollback=[Step("roll back", "Cli -p 15", _script([f"configure session {NAME} abort"]))],
                       expected=expected_lines(kind, lines))
    if kind == "junos":
        return Session(kind, save=[Step("save: configuration", "show configuration | display set")],
                       apply=[Step("apply with commit confirmed", "cli",
                                   _script(["configure private", *lines, "commit confirmed 5", "exit"]))],
                       readback=Step("read back", "show configuration class-of-service | display set"
                                     if all(line.startswith("set class-of-service ") for line in lines)
                                     else "show configuration | display set"),  # the pure-ACK filter
                       confirm=[Step("confirm", "cli", _script(["configure private", "commit", "exit"]))],
                       rollback=[Step("roll back", "cli", _script(["configure private", "rollback 1", "commit",
                                                                   "exit"]))],
                       expected=expected_lines(kind, lines))
    if kind == "nxos":
        return Session(kind, save=[Step("save: checkpoint", f"checkpoint {NAME}")],
                       apply=[Step("apply", "configure terminal", _script([*lines, "end"]))],
                       readback=Step("read back", "show running-config ipqos" if not any(
                           line.startswith("ip access-list") for line in lines) else "show running-config"),
                       confirm=[Step("drop the checkpoint", f"no checkpoint {NAME}")],
                       rollback=[Step("roll back", f"rollback running-config checkpoint {NAME}")],
                       expected=lines)
    if kind == "nvue":
        return Session(kind, save=[Step("save: note the applied revision", "nv config history")],
                       apply=[Step("apply", "bash -s", _script([*lines, "nv config apply -y"]))],
                       readback=Step("read back", "nv config show -o commands"),
                       rollback=[Step("roll back", "nv config apply {revision} -y")],
                       expected=lines)
    raise ConfigError(f"no switch session for target {kind!r}: openconfig is pushed with gNMI Set "
                      "(render it with `geryon netconf render --target openconfig`); linux uses --target linux@HOST")


def _present(expected: list[str], output: str) -> list[str]:
    have = {" ".join(line.split()) for line in output.splitlines()}
    return [line for line in expected if " ".join(line.split()) not in have]


def _sonic_json(text: str) -> dict:
    try:
        return json.loads(text or "{}")
    except ValueError:
        raise ApplyError("SONiC `show runningconfiguration all` did not print JSON") from None


def _sonic_missing(profile: QosProfile, before: dict, patch: list[dict], running_text: str) -> list:
    """What the read-back lacks: geryon's fields not as rendered, or any other field changed by the patch."""
    after = _sonic_json(running_text)
    missing = json_patch(after, config_db(profile))
    if missing:
        return missing
    expected = apply_patch(before, patch)
    return [f"{table}|{key}" for table in sorted(set(expected) | set(after))
            for key in sorted(set(expected.get(table, {})) | set(after.get(table, {})))
            if expected.get(table, {}).get(key) != after.get(table, {}).get(key)]


def run_session(profile: QosProfile, endpoint: Endpoint, dry_run: bool = False,
                known_hosts: str | None = None) -> ApplyResult:
    """Show (dry run) or execute the vendor session for `profile` on `endpoint`."""
    rendering = render(profile, endpoint.kind)
    result = ApplyResult(f"{endpoint.kind}@{endpoint.address}")
    if dry_run:
        session = build_session(rendering.profile, rendering)
        result.steps = ["dry run: nothing sent"] + (
            ["SONiC: the patch below is against an empty running config; run without --dry-run to compute it "
             "from the switch"] if endpoint.kind == "sonic" else [])
        result.diff = session.show().splitlines()
        return result
    with SshShell(endpoint, known_hosts) as shell:
        return _execute(rendering, endpoint, shell, result)


def _execute(rendering: Rendering, endpoint: Endpoint, shell, result: ApplyResult) -> ApplyResult:
    profile = rendering.profile
    probe = build_session(profile, rendering)
    before = shell.check(probe.readback.command)
    running = None
    if endpoint.kind == "sonic":
        running = _sonic_json(before)
        session = build_session(profile, rendering, running)
        if not json_patch(running, config_db(profile)):
            result.steps.append("no change: the running config already has this profile")
            return result
    else:
        session = probe
        if not _present(session.expected, before):
            result.steps.append("no change: the running config already has this profile")
            return result
    revision = None
    for step in session.save:
        out = shell.check(step.command, step.stdin)
        result.steps.append(step.name)
        if endpoint.kind == "nvue":
            revision = _latest_revision(out)
    result.diff = session.show().splitlines()
    try:
        for step in session.apply:
            shell.check(step.command, step.stdin)
            result.steps.append(step.name)
        after = shell.check(session.readback.command)
        missing = (_sonic_missing(profile, running, json_patch(running, config_db(profile)), after)
                   if endpoint.kind == "sonic" else _present(session.expected, after))
        if missing:
            raise ApplyError(f"read back from {endpoint.address} lacks {len(missing)} item(s), first: {missing[0]}")
        result.steps.append("read back: matches")
        for step in session.confirm:
            shell.check(step.command, step.stdin)
            result.steps.append(step.name)
        result.changed = True
        return result
    except GeryonError as exc:
        result.error = str(exc)
        for step in session.rollback:
            command = step.command.replace("{revision}", revision or "")
            shell.run(command, step.stdin)
            result.steps.append(step.name)
        result.rolled_back = True
        undo = "; ".join(f"{s.name}: {s.command}" if endpoint.kind == "sonic"  # the patch itself is long JSON
                         else " ".join([s.command, *(s.stdin or "").split("\n")]).strip() for s in session.rollback)
        raise ApplyError(f"applying to {endpoint.address} failed: {exc}; rolled back with `{undo}`") from exc


def _latest_revision(history: str) -> str | None:
    match = re.search(r"(?m)^\s*(?:rev[_ -]?id:?\s*)?(\d+)\b", history)
    return match.group(1) if match else None
