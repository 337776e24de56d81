"""The launcher's command line and environment, parsed and validated into one `LaunchConfig`.

Every flag has an environment-variable twin (`--workers` / `GERYON_WORKERS`); a flag on the command
line wins over its twin. Everything a user can get wrong is checked here, before any process,
namespace or SSH connection exists, and reported as a ConfigError that says what to do.
"""

import argparse
import math
import os
import secrets
from dataclasses import dataclass, field

from geryon import envvars as ev
from geryon.collectives import GERYON, check_class_count, parse_collectives
from geryon.errors import ConfigError, require_root
from geryon.launch.hostfile import HostSpec, parse_hostfile
from geryon.rates import parse_rate
from geryon.syncmodes import parse_straggler, parse_sync
from geryon.transport.policy import PLACEMENTS, POLICIES

PRIORITY_SCHEMES = ("coarse", "search", "threshold=T")
TOPOLOGIES = ("star", "leafspine")
BACKENDS = ("local", "emulate", "ssh")
DEFAULT_WORKERS = 2
DEFAULT_BW = "100mbit"
DEFAULT_GRACE_S = 5.0
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

# flag -> environment twin; the same names are what ranks see about their job (geryon.launch.environment)
ENV_TWINS = {
    "mode": ev.MODE, "workers": ev.WORKERS, "servers": ev.SERVERS, "policy": ev.POLICY,
    "priority": ev.PRIORITY, "classes": ev.CLASSES, "emulate": ev.EMULATE, "bw": ev.BW,
    "topology": ev.TOPOLOGY, "local": ev.LOCAL, "hostfile": ev.HOSTFILE, "known_hosts": ev.KNOWN_HOSTS,
    "timeline": ev.TIMELINE, "timeout": ev.TIMEOUT, "grace": ev.GRACE, "ps_optimizer": ev.PS_OPTIMIZER,
    "ps_pull": ev.PS_PULL, "ps_placement": ev.PS_PLACEMENT, "server_device": ev.SERVER_DEVICE,
    "max_classes": ev.MAX_CLASSES, "tls": ev.TLS,
    "collectives": ev.COLLECTIVES, "tenants": ev.TENANTS, "tenant": ev.TENANT,
    "max_restarts": ev.MAX_RESTARTS, "ps_checkpoint_every": ev.PS_CHECKPOINT_EVERY,
    "ps_checkpoint_dir": ev.PS_CHECKPOINT_DIR, "overlap": ev.OVERLAP, "plain_ddp": ev.PLAIN_DDP,
    "sync": ev.SYNC, "straggler": ev.STRAGGLER, "start": ev.START,
}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class LaunchConfig:
    """Everything one job needs, validated; built by `parse_launch_args` or directly in code."""

    script: str                                  # absolute path of the training script
    script_args: tuple[str, ...] = ()
    mode: str = "allreduce"                      # "allreduce" | "ps"
    workers: int = DEFAULT_WORKERS
    servers: int = 0                             # parameter servers (ps mode only)
    policy: str = ev.DEFAULT_POLICY
    priority: str = "coarse"                     # "coarse" | "search" | "threshold=T"
    classes: str | None = None                   # canonical "name:dscp,..." or None (the default two)
    max_classes: int | None = None               # --priority search: search K−1 thresholds (K classes)
    backend: str = "local"                       # "local" | "emulate" | "ssh"
    bw: int = 100_000_000                        # emulated link rate, bits/s
    topology: str = "star"
    hosts: tuple[HostSpec, ...] = ()             # ssh backend: the hostfile's hosts
    known_hosts: str | None = None               # ssh backend: the known_hosts file keys are checked against
    timeline: str | None = None                  # absolute path of the Chrome trace to write
    timeout: float | None = None                 # seconds; the job is stopped after it
    grace: float = DEFAULT_GRACE_S               # seconds between SIGTERM and SIGKILL when stopping ranks
    ps_optimizer: str = "auto"                   # ps mode: who runs the optimizer (auto | server | worker)
    ps_pull: str = "auto"                        # ps mode: when workers ask for the next parameters
    ps_placement: str = "bytes"                  # ps mode: slices over servers, byte-balanced or round-robin
    server_device: str = "cpu"                   # ps mode: where servers hold their shards (cpu | cuda)
    overlap: str = "barrier"                     # allreduce mode: update after every bucket, or per layer
    plain_ddp: bool = False                      # allreduce mode: the script's DDP over gloo (a baseline)
    job_id: str = field(default_factory=lambda: "j" + secrets.token_hex(3)[:5])  # also the cluster name
    secret: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    tls: bool = False                            # TLS on the data flows (geryon.transport.tls)
    tls_file: str | None = None                  # set by the launcher: the job's credentials (0600)
    collectives: str = GERYON                    # allreduce mode: what carries the buckets (geryon.collectives)
    max_restarts: int = 0                        # restarts of the whole job after a rank or server failed
    restart_count: int = 0                       # set by the launcher: this start's number (0: the first)
    ps_checkpoint_every: int = 0                 # ps mode: the servers checkpoint every K steps (0: never)
    ps_checkpoint_dir: str | None = None         # ps mode: absolute path of the servers' checkpoints
    sync: str = "full"                           # allreduce mode: full | partial[:P] | partial-static[:P]
    straggler: str | None = None                 # "RANK:FACTOR": one worker made FACTOR times slower
    start: str = "exec"                          # how local and emulated ranks start: exec | fork

    @property
    def ranks(self) -> int:
        """Processes in the job: workers plus servers."""
        return self.workers + self.servers


def build_parser(environ=None) -> argparse.ArgumentParser:
    """The `python -m geryon.launch` parser; defaults come from the environment twins."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="python -m geryon.launch",
        description="Run a PyTorch training script as a distributed job whose urgent parameters move "
                    "first. See `pydoc geryon.launch` for the manual.")

    def twin(name):
        return env.get(ENV_TWINS[name])

    parser.add_argument("--mode", default=twin("mode"), metavar="ps|allreduce",
                        help=f"parameter servers or ring allreduce (default allreduce; {ev.MODE})")
    parser.add_argument("--workers", "--nproc-per-node", "--nproc_per_node", dest="workers",
                        default=twin("workers"), metavar="N",
                        help=f"worker processes (default {DEFAULT_WORKERS}, or the hostfile's slots; "
                             f"--nproc-per-node is torchrun's name for it; {ev.WORKERS})")
    parser.add_argument("--servers", default=twin("servers"), metavar="M",
                        help=f"parameter servers, ps mode only (default 1; {ev.SERVERS})")
    parser.add_argument("--policy", default=twin("policy"), metavar="|".join(POLICIES),
                        help=f"scheduling policy (default geryon; {ev.POLICY})")
    parser.add_argument("--priority", default=twin("priority"), metavar="coarse|search|threshold=T",
                        help=f"how parameters are split into classes (default coarse; {ev.PRIORITY})")
    parser.add_argument("--classes", default=twin("classes"), metavar="SPEC",
                        help=f"priority classes, e.g. 'high:46,low:0' or '3' ({ev.CLASSES})")
    parser.add_argument("--tenants", default=twin("tenants"), metavar="FILE",
                        help="the tenants file of a fabric shared with other jobs (docs/tenants.md); with "
                             f"--tenant NAME the job's classes go on the fabric's DSCPs ({ev.TENANTS})")
    parser.add_argument("--tenant", default=twin("tenant"), metavar="NAME",
                        help=f"this job's name in the --tenants file ({ev.TENANT})")
    parser.add_argument("--max-classes", default=twin("max_classes"), metavar="K",
                        help="with --priority search: search K-1 thresholds over K classes (default 2; "
                             f"--classes defaults to K classes; {ev.MAX_CLASSES})")
    parser.add_argument("--emulate", action="store_true", default=None,
                        help=f"run on an emulated cluster in namespaces (default when root; {ev.EMULATE})")
    parser.add_argument("--bw", default=twin("bw"), metavar="RATE",
                        help=f"emulated link rate (default {DEFAULT_BW}; {ev.BW})")
    parser.add_argument("--topology", default=twin("topology"), metavar="star|leafspine",
                        help=f"emulated topology (default star; {ev.TOPOLOGY})")
    parser.add_argument("--local", action="store_true", default=None,
                        help=f"run as local processes on loopback (default when not root; {ev.LOCAL})")
    parser.add_argument("--hostfile", default=twin("hostfile"), metavar="FILE",
                        help=f"run on the real hosts listed in FILE over SSH ({ev.HOSTFILE})")
    parser.add_argument("--known-hosts", default=twin("known_hosts"), metavar="FILE",
                        help=f"SSH host keys to trust (default {DEFAULT_KNOWN_HOSTS}; {ev.KNOWN_HOSTS})")
    parser.add_argument("--timeline", default=twin("timeline"), metavar="FILE",
                        help=f"write a Chrome/Perfetto trace of the job to FILE ({ev.TIMELINE})")
    parser.add_argument("--timeout", default=twin("timeout"), metavar="S",
                        help=f"stop the job after S seconds ({ev.TIMEOUT})")
    parser.add_argument("--grace", default=twin("grace"), metavar="S",
                        help=f"seconds between SIGTERM and SIGKILL when stopping ranks "
                             f"(default {DEFAULT_GRACE_S:g}; {ev.GRACE})")
    parser.add_argument("--ps-optimizer", default=twin("ps_optimizer"), metavar="auto|server|worker",
                        help="ps mode: the servers run the optimizer (elementwise torch.optim classes) or "
                             "average gradients for the workers to step (default auto: the servers when "
                             f"they can; {ev.PS_OPTIMIZER})")
    parser.add_argument("--ps-pull", default=twin("ps_pull"), metavar="auto|end|ahead",
                        help="ps mode: ask for the next parameters once step() runs (end) or with the "
                             "iteration's first push, so each comes back as soon as its update is made "
                             "(ahead); default auto: ahead when the workers step, end when the servers "
                             f"do ({ev.PS_PULL}; docs/ps-optimizers.md)")
    parser.add_argument("--ps-placement", default=twin("ps_placement"), metavar="bytes|count",
                        help="ps mode: deal the slices over the servers by bytes (each to the server "
                             "holding the fewest so far; the default) or round-robin by count (P3's "
                             f"way) ({ev.PS_PLACEMENT})")
    parser.add_argument("--server-device", default=twin("server_device"), metavar="cpu|cuda",
                        help="ps mode: where each server holds its shards and runs the optimizer: the "
                             "CPU (the default) or its GPU (by LOCAL_RANK); the workers' models may be "
                             f"on GPUs either way ({ev.SERVER_DEVICE}; docs/gpu.md)")
    parser.add_argument("--overlap", default=twin("overlap"), metavar="barrier|next-forward",
                        help="allreduce mode: step() updates after every bucket is reduced (barrier, "
                             "DDP's way; the default) or each parameter as soon as its bucket is, the "
                             "next forward waiting per layer for its own (next-forward; elementwise "
                             f"torch.optim classes; {ev.OVERLAP}; docs/allreduce-overlap.md)")
    parser.add_argument("--plain-ddp", action="store_true", default=None,
                        help="allreduce mode: leave the script's DistributedDataParallel as torchrun would "
                             "(gloo, no priority flows), to compare geryon with what a DDP user runs "
                             f"otherwise ({ev.PLAIN_DDP})")
    parser.add_argument("--tls", action="store_true", default=None,
                        help="encrypt the data flows with TLS; the launcher makes a key and certificate "
                             f"for the job and every rank verifies its peers' against it ({ev.TLS})")
    parser.add_argument("--collectives", default=twin("collectives"),
                        metavar="geryon|nccl|nccl-ib:SL,...|gloo-classes",
                        help="allreduce mode: what carries the gradient buckets: geryon's ring over its "
                             "marked flows (default), one NCCL group per class with its own traffic class "
                             "(RoCE: DSCP << 2; nccl-ib: one InfiniBand service level per class), or one "
                             f"gloo group per class, unmarked (docs/nccl.md; {ev.COLLECTIVES})")
    parser.add_argument("--sync", default=twin("sync"), metavar="full|partial[:P]|partial-static[:P]",
                        help="allreduce mode: every worker averages every gradient (full, the default), or "
                             "groups of P workers (default 4) average their models after local steps, "
                             "groups formed from the workers ready first (partial) or by a fixed schedule "
                             f"(partial-static); Ripples' partial allreduce (docs/partial-allreduce.md; {ev.SYNC})")
    parser.add_argument("--straggler", default=twin("straggler"), metavar="RANK:FACTOR",
                        help="make worker RANK FACTOR times slower: after each step it sleeps FACTOR - 1 "
                             f"times the compute it just did ({ev.STRAGGLER})")
    parser.add_argument("--max-restarts", default=twin("max_restarts"), metavar="N",
                        help="when a rank or server fails, stop the job and start it again, up to N times "
                             f"(default 0; {ev.MAX_RESTARTS})")
    parser.add_argument("--ps-checkpoint-every", default=twin("ps_checkpoint_every"), metavar="K",
                        help="ps mode: the servers write their shards, optimizer state and version every K "
                             "steps to --ps-checkpoint-dir, and a (re)started job resumes from the last "
                             f"consistent step there ({ev.PS_CHECKPOINT_EVERY})")
    parser.add_argument("--ps-checkpoint-dir", default=twin("ps_checkpoint_dir"), metavar="DIR",
                        help=f"ps mode: where the servers' checkpoints go ({ev.PS_CHECKPOINT_DIR})")
    parser.add_argument("--start", default=twin("start"), metavar="exec|fork",
                        help="how ranks on this machine start: exec, a new interpreter each (default), or "
                             "fork, from a template that imported torch once (a second or so less CPU per "
                             f"rank: many short jobs; --local and --emulate, SSH ranks always exec; {ev.START}; "
                             "pydoc geryon.launch.template)")
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")
    return parser


def parse_launch_args(argv: list[str] | None = None, environ=None) -> LaunchConfig:
    """Parse and validate a command line (and the environment twins) into a LaunchConfig."""
    env = os.environ if environ is None else environ
    args = build_parser(env).parse_args(argv)
    if args.emulate is None:
        args.emulate = _flag_from_env(env, "emulate")
    if args.local is None:
        args.local = _flag_from_env(env, "local")
    if args.tls is None:
        args.tls = _flag_from_env(env, "tls")
    if args.plain_ddp is None:
        args.plain_ddp = _flag_from_env(env, "plain_ddp")
    return config_from_args(args)


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Validate parsed arguments (strings or None) into a LaunchConfig; raise ConfigError on bad input."""
    script = _check_script(args.script)
    mode = _choice(args.mode or "allreduce", ev.MODES, "--mode")
    policy = _choice(args.policy or "geryon", POLICIES, "--policy")
    priority = check_priority(args.priority or "coarse")
    classes = check_classes(args.classes)
    tenant_spec = check_tenant(getattr(args, "tenants", None), getattr(args, "tenant", None), classes)
    classes = tenant_spec or classes
    max_classes = _count(getattr(args, "max_classes", None), "--max-classes", minimum=2)
    if max_classes is not None:
        classes = _search_classes(priority, classes, max_classes)
    backend = _choose_backend(bool(args.emulate), bool(args.local), args.hostfile)
    if backend != "emulate":
        for flag, value in (("--bw", args.bw), ("--topology", args.topology)):
            if value is not None:
                raise ConfigError(f"{flag} describes the emulated cluster; it has no effect with the "
                                  f"{backend} backend (drop it, or use --emulate)")
    bw = parse_rate(args.bw or DEFAULT_BW)
    topology = _choice(args.topology or "star", TOPOLOGIES, "--topology")
    hosts = parse_hostfile(args.hostfile) if backend == "ssh" else ()

    servers = _count(args.servers, "--servers", minimum=0)
    if mode == "ps":
        servers = 1 if servers is None else servers
        if servers < 1:
            raise ConfigError("--mode ps needs at least one server (--servers M, M >= 1)")
    elif servers:
        raise ConfigError(f"--servers {servers} applies to --mode ps only; allreduce has no servers")
    else:
        servers = 0
    ps_optimizer = getattr(args, "ps_optimizer", None)
    if ps_optimizer and mode != "ps":
        raise ConfigError(f"--ps-optimizer {ps_optimizer} applies to --mode ps only")
    ps_optimizer = _choice(ps_optimizer or "auto", ev.PS_OPTIMIZER_MODES, "--ps-optimizer")
    ps_pull = getattr(args, "ps_pull", None)
    if ps_pull and mode != "ps":
        raise ConfigError(f"--ps-pull {ps_pull} applies to --mode ps only")
    ps_pull = _choice(ps_pull or "auto", ev.PS_PULL_MODES, "--ps-pull")
    ps_placement = getattr(args, "ps_placement", None)
    if ps_placement and mode != "ps":
        raise ConfigError(f"--ps-placement {ps_placement} applies to --mode ps only")
    ps_placement = _choice(ps_placement or "bytes", PLACEMENTS, "--ps-placement")
    server_device = getattr(args, "server_device", None)
    if server_device and server_device != "cpu" and mode != "ps":
        raise ConfigError(f"--server-device {server_device} applies to --mode ps only (there are no servers "
                          "in --mode allreduce)")
    server_device = _choice(server_device or "cpu", ev.SERVER_DEVICES, "--server-device")
    overlap = getattr(args, "overlap", None)
    if overlap and overlap != "barrier" and mode != "allreduce":
        raise ConfigError(f"--overlap {overlap} applies to --mode allreduce only (in --mode ps, "
                          "--ps-pull ahead overlaps the update with backward)")
    overlap = _choice(overlap or "barrier", ev.OVERLAP_MODES, "--overlap")
    workers = _count(args.workers, "--workers", minimum=1)
    if workers is None:
        workers = sum(h.slots for h in hosts) if hosts else DEFAULT_WORKERS
    if hosts:
        _check_placement(hosts, workers, servers, args.hostfile)

    known_hosts = None
    if backend == "ssh":
        known_hosts = os.path.abspath(os.path.expanduser(args.known_hosts or DEFAULT_KNOWN_HOSTS))
        if not os.path.isfile(known_hosts):
            raise ConfigError(f"known_hosts file {known_hosts!r} does not exist; geryon never accepts "
                              f"unknown host keys: add them after checking their fingerprints "
                              f"(ssh-keyscan -p PORT HOST >> {known_hosts}) or pass --known-hosts FILE")
    if backend == "emulate":
        require_root("--emulate (it builds network namespaces)", "run it with sudo or use --local")
        from geryon.emulate.topology import check_host_count  # lazy: pulls in pyroute2

        check_host_count(emulated_host_count(workers, servers))
    timeline = None
    if args.timeline:
        timeline = os.path.abspath(args.timeline)
        if not os.path.isdir(os.path.dirname(timeline)):
            raise ConfigError(f"--timeline {args.timeline!r}: folder {os.path.dirname(timeline)!r} "
                              f"does not exist")
    collectives = check_collectives(getattr(args, "collectives", None), mode, policy, classes,
                                    bool(getattr(args, "tls", False)))
    if overlap != "barrier" and collectives != GERYON:
        raise ConfigError(f"--overlap {overlap} runs on geryon's own ring allreduce: use it with the default "
                          "--collectives geryon")
    plain_ddp = bool(getattr(args, "plain_ddp", False))
    if plain_ddp and (mode != "allreduce" or overlap != "barrier" or collectives != GERYON):
        raise ConfigError("--plain-ddp runs the script's own DistributedDataParallel over gloo: it applies "
                          "to --mode allreduce with the default --overlap barrier and --collectives geryon only")
    sync, straggler = check_sync(getattr(args, "sync", None), getattr(args, "straggler", None), mode,
                                 collectives, workers)
    if sync != "full" and (overlap != "barrier" or plain_ddp):
        raise ConfigError(f"--sync {sync} averages models after each local step; --overlap and --plain-ddp "
                          "change how full allreduce runs: drop them, or use --sync full")
    timeout = _seconds(args.timeout, "--timeout", allow_zero=False)
    max_restarts = _count(getattr(args, "max_restarts", None), "--max-restarts", minimum=0) or 0
    every, checkpoint_dir = _ps_checkpoints(args, mode, priority, ps_optimizer)
    grace = _seconds(args.grace, "--grace", allow_zero=True)
    start = _choice(getattr(args, "start", None) or "exec", ev.START_MODES, "--start")
    return LaunchConfig(
        script=script, script_args=tuple(args.script_args or ()), mode=mode, workers=workers,
        servers=servers, policy=policy, priority=priority, classes=classes, max_classes=max_classes,
        backend=backend, bw=bw,
        topology=topology, hosts=hosts, known_hosts=known_hosts, timeline=timeline, timeout=timeout,
        grace=DEFAULT_GRACE_S if grace is None else grace, ps_optimizer=ps_optimizer, ps_pull=ps_pull,
        ps_placement=ps_placement, server_device=server_device, overlap=overlap, plain_ddp=plain_ddp,
        tls=bool(getattr(args, "tls", False)), collectives=collectives, max_restarts=max_restarts,
        ps_checkpoint_every=every,
        ps_checkpoint_dir=checkpoint_dir, sync=sync, straggler=straggler, start=start)


def _ps_checkpoints(args, mode: str, priority: str, ps_optimizer: str) -> tuple[int, str | None]:
    """--ps-checkpoint-every K and --ps-checkpoint-dir DIR: both or neither, ps mode, servers stepping."""
    every = _count(getattr(args, "ps_checkpoint_every", None), "--ps-checkpoint-every", minimum=1)
    directory = getattr(args, "ps_checkpoint_dir", None) or None
    if every is None and directory is None:
        return 0, None
    if every is None or directory is None:
        raise ConfigError("--ps-checkpoint-every K and --ps-checkpoint-dir DIR go together: give both")
    if mode != "ps":
        raise ConfigError("--ps-checkpoint-every applies to --mode ps only; in allreduce mode there is no "
                          "server state: resume from the script's own checkpoint")
    if ps_optimizer == "worker":
        raise ConfigError("--ps-checkpoint-every saves the optimizer the servers run; with --ps-optimizer "
                          "worker the optimizer state lives in the workers: save the script's own checkpoint")
    if priority == "search":
        raise ConfigError("--ps-checkpoint-every with --priority search: a restart would search again from "
                          "the start; choose a threshold (--priority threshold=T) for a job that checkpoints")
    directory = os.path.abspath(os.path.expanduser(directory))
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError(f"--ps-checkpoint-dir {directory!r} is a file, not a directory")
    return every, directory


def _search_classes(priority: str, classes: str | None, max_classes: int) -> str:
    """--max-classes K: only with --priority search; the transport needs at least K classes."""
    if priority != "search":
        raise ConfigError(f"--max-classes {max_classes} sets how many classes --priority search uses; with "
                          f"--priority {priority} the classes are fixed (drop --max-classes, or use "
                          "--priority search)")
    if classes is None:
        return check_classes(str(max_classes))
    count = len(classes.split(","))
    if count < max_classes:
        raise ConfigError(f"--max-classes {max_classes} needs at least {max_classes} priority classes, but "
                          f"--classes {classes!r} has {count}; give more classes or a smaller --max-classes")
    return classes


def check_sync(sync_text: str | None, straggler_text: str | None, mode: str, collectives: str,
               workers: int) -> tuple[str, str | None]:
    """Validate --sync and --straggler against the other flags; their canonical texts."""
    sync = parse_sync(sync_text)
    if sync.partial and mode != "allreduce":
        raise ConfigError(f"--sync {sync.text()} applies to --mode allreduce only; in ps mode the servers "
                          "keep one model")
    if sync.partial and collectives != GERYON:
        raise ConfigError(f"--sync {sync.text()} averages models over geryon's flows; drop --collectives "
                          f"{collectives}, or use --sync full")
    straggler = parse_straggler(straggler_text, workers)
    return sync.text(), straggler.text() if straggler else None


def check_collectives(text: str | None, mode: str, policy: str, classes: str | None, tls: bool) -> str:
    """Validate --collectives against the other flags; its canonical text."""
    chosen = parse_collectives(text)
    if not chosen.process_groups:
        return chosen.text()
    if mode != "allreduce":
        raise ConfigError(f"--collectives {chosen.text()} applies to --mode allreduce only; ps mode's pushes "
                          "and pulls travel over geryon's transport")
    if policy != ev.DEFAULT_POLICY:
        raise ConfigError(f"--policy {policy} chooses how geryon's transport schedules its flows; with "
                          f"--collectives {chosen.text()} the classes' process groups carry the buckets (drop "
                          "--policy, or use --collectives geryon)")
    if tls:
        raise ConfigError("--tls encrypts geryon's own flows; NCCL and gloo groups are not encrypted (drop "
                          "--tls, or use --collectives geryon)")
    check_class_count(chosen, len(classes.split(",")) if classes else 2)
    return chosen.text()


def default_backend() -> str:
    """The backend when none is chosen: the emulated cluster when root, else local processes."""
    return "emulate" if os.geteuid() == 0 else "local"


def emulated_host_count(workers: int, servers: int) -> int:
    """Hosts of the job's emulated cluster: one per rank (a cluster has at least two)."""
    return max(2, workers + servers)


def check_priority(text: str) -> str:
    """Validate a priority scheme: 'coarse', 'search' or 'threshold=T' with T a positive number."""
    if text in ("coarse", "search"):
        return text
    key, sep, value = text.partition("=")
    if key == "threshold" and sep:
        try:
            if 0 < float(value) <= 1:
                return f"threshold={value}"
        except ValueError:
            pass
        raise ConfigError(f"--priority {text!r}: the threshold must be a positive number up to 1 "
                          f"(the share of the urgency order in class 0), e.g. threshold=0.5")
    raise ConfigError(f"unknown --priority {text!r}; choose one of {', '.join(PRIORITY_SCHEMES)}")


def check_tenant(path: str | None, name: str | None, classes: str | None) -> str | None:
    """--tenants FILE --tenant NAME: the job's classes on the fabric's DSCPs, in 'name:dscp,...' form."""
    if not path and not name:
        return None
    if not path or not name:
        raise ConfigError("--tenants FILE and --tenant NAME go together: the file describes the fabric's jobs, "
                          "the name says which one this is (docs/tenants.md)")
    if classes is not None:
        raise ConfigError(f"--tenant {name} sets the job's classes from {path}; drop --classes {classes!r}")
    from geryon.netconf.tenants import load_tenants, tenant_class_spec  # lazy, as check_classes

    return tenant_class_spec(load_tenants(path), name)


def check_classes(spec: str | None) -> str | None:
    """Validate a class spec with geryon.netconf and return it in canonical 'name:dscp,...' form."""
    if spec is None or spec == "":
        return None
    from geryon.netconf import format_classes, parse_classes  # lazy: netconf is not needed for other flags

    return format_classes(parse_classes(spec))


def _check_script(path: str) -> str:
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise ConfigError(f"training script {path!r} not found (looked for {full})")
    return full


def _choice(value: str, choices: tuple[str, ...], flag: str) -> str:
    if value not in choices:
        raise ConfigError(f"unknown {flag} {value!r}; choose one of {', '.join(choices)}")
    return value


def _choose_backend(emulate: bool, local: bool, hostfile: str | None) -> str:
    chosen = [name for name, on in (("--emulate", emulate), ("--local", local),
                                    ("--hostfile", bool(hostfile))) if on]
    if len(chosen) > 1:
        raise ConfigError(f"{' and '.join(chosen)} exclude each other; pick one backend")
    if emulate:
        return "emulate"
    if local:
        return "local"
    if hostfile:
        return "ssh"
    return default_backend()


def _check_placement(hosts: tuple[HostSpec, ...], workers: int, servers: int, hostfile: str) -> None:
    if servers > len(hosts):
        raise ConfigError(f"{servers} servers need {servers} hosts (one server per host) but "
                          f"{hostfile!r} lists {len(hosts)}; add hosts or lower --servers")
    slots = sum(h.slots for h in hosts)
    if workers > slots:
        raise ConfigError(f"{workers} workers need {workers} slots but {hostfile!r} has {slots}; "
                          f"raise slots=N on its lines or lower --workers")


def _count(value, flag: str, minimum: int) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {value!r} is not a whole number") from None
    if number < minimum:
        raise ConfigError(f"{flag} {number} must be at least {minimum}")
    return number


def _seconds(value, flag: str, allow_zero: bool) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {value!r} is not a number of seconds") from None
    if not math.isfinite(number):
        raise ConfigError(f"{flag} {value!r} is not a finite number of seconds")
    if number < 0 or (number == 0 and not allow_zero):
        raise ConfigError(f"{flag} {value!r} must be {'non-negative' if allow_zero else 'positive'}")
    return number


def _flag_from_env(env, name: str) -> bool:
    value = env.get(ENV_TWINS[name], "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{ENV_TWINS[name]}={value!r}: use 1 or 0")
