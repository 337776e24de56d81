"""Every GERYON_* environment variable, named once: the contract between the launcher and a rank.

As torchrun's `LaunchConfig` -> worker environment -> `torch.distributed`, the variables are the only
thing the two halves share: the launcher writes them (geryon.launch.environment), a rank reads them
once into a `RankEnv` (geryon.runtime.env). Tools outside a job read the few at the end. No other
module spells a GERYON_ name; import the constant from here.
"""

PREFIX = "GERYON_"

# -- the launcher's flags' twins (`--workers` / GERYON_WORKERS; geryon.launch.config) ------------------
MODE = "GERYON_MODE"
WORKERS = "GERYON_WORKERS"
SERVERS = "GERYON_SERVERS"
POLICY = "GERYON_POLICY"
PRIORITY = "GERYON_PRIORITY"
CLASSES = "GERYON_CLASSES"
EMULATE = "GERYON_EMULATE"
BW = "GERYON_BW"
TOPOLOGY = "GERYON_TOPOLOGY"
LOCAL = "GERYON_LOCAL"
HOSTFILE = "GERYON_HOSTFILE"
KNOWN_HOSTS = "GERYON_KNOWN_HOSTS"
TIMELINE = "GERYON_TIMELINE"
TIMEOUT = "GERYON_TIMEOUT"
GRACE = "GERYON_GRACE"
MAX_CLASSES = "GERYON_MAX_CLASSES"   # --priority search over K classes (the launcher sets SEARCH_CLASSES)
PS_OPTIMIZER = "GERYON_PS_OPTIMIZER"
PS_PULL = "GERYON_PS_PULL"
# the values the job variables take, checked by the launcher (its flags) and by the rank (RankEnv)
MODES = ("allreduce", "ps")                        # MODE
PS_OPTIMIZER_MODES = ("auto", "server", "worker")  # PS_OPTIMIZER
PS_PULL_MODES = ("auto", "end", "ahead")           # PS_PULL
SERVER_DEVICES = ("cpu", "cuda")                   # SERVER_DEVICE, cpu the default
OVERLAP_MODES = ("barrier", "next-forward")        # OVERLAP, barrier the default
PS_PLACEMENT = "GERYON_PS_PLACEMENT"
SERVER_DEVICE = "GERYON_SERVER_DEVICE"   # ps mode: where servers hold their shards and step
PLAIN_DDP = "GERYON_PLAIN_DDP"         # allreduce mode without geryon's transport: DDP over gloo
OVERLAP = "GERYON_OVERLAP"             # allreduce mode: barrier or next-forward (geryon.runtime.ddp_overlap)
TLS = "GERYON_TLS"                   # --tls: TLS on the data flows, per-job credentials
START = "GERYON_START"               # --start: how ranks start (exec a new interpreter, or fork a template)
START_MODES = ("exec", "fork")       # START, exec the default (geryon.launch.template)
COLLECTIVES = "GERYON_COLLECTIVES"   # --collectives: what carries allreduce mode's buckets (geryon.collectives)
MAX_RESTARTS = "GERYON_MAX_RESTARTS"             # --max-restarts: restarts of a failed job
PS_CHECKPOINT_EVERY = "GERYON_PS_CHECKPOINT_EVERY"   # ps mode: the servers checkpoint every K steps ...
PS_CHECKPOINT_DIR = "GERYON_PS_CHECKPOINT_DIR"       # ... into this directory (geryon.runtime.server_checkpoint)
TENANTS = "GERYON_TENANTS"           # --tenants: the tenants file of the fabric the job shares
TENANT = "GERYON_TENANT"             # --tenant: this job's name in it (its classes on the fabric's DSCPs)
SYNC = "GERYON_SYNC"                 # --sync: full, partial[:P] or partial-static[:P] (geryon.syncmodes)
STRAGGLER = "GERYON_STRAGGLER"       # --straggler RANK:FACTOR: one worker made FACTOR times slower

# -- what the launcher gives every rank (besides torch's RANK, WORLD_SIZE, MASTER_ADDR, ...) -----------
ROLE = "GERYON_ROLE"
RANK_NAME = "GERYON_RANK_NAME"
WORKER_RANK = "GERYON_WORKER_RANK"
SERVER_RANK = "GERYON_SERVER_RANK"
JOB_ID = "GERYON_JOB_ID"
JOB_SECRET = "GERYON_JOB_SECRET"
BACKEND = "GERYON_BACKEND"
HOST_IP = "GERYON_HOST_IP"
IFACE = "GERYON_IFACE"
STORE_PREFIX = "GERYON_STORE_PREFIX"
TLS_FILE = "GERYON_TLS_FILE"                 # --tls: the job's key + certificate, a 0600 file (local, emulate)
TLS_CREDENTIALS = "GERYON_TLS_CREDENTIALS"   # --tls over SSH: the same, base64, read from the channel's stdin
RESTART_COUNT = "GERYON_RESTART_COUNT"       # 0 at the first start, n after the n-th restart
TORCH_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"   # torchrun's name for the same number

# -- set by the job spec when another engine starts the ranks (torchrun, Slurm, Kubernetes; docs/engines.md)
JOB_SECRET_FILE = "GERYON_JOB_SECRET_FILE"   # a file holding the job secret (a mounted Kubernetes Secret)
CONFIG = "GERYON_CONFIG"                     # a TOML file of job settings (keys: the variables' names)
SERVERS_PER_NODE = "GERYON_SERVERS_PER_NODE"   # ps mode: the first P local ranks of every node serve

JOB_VARIABLES = {
    ROLE: "worker or server",
    RANK_NAME: "worker0, server1, ... (the prefix of the rank's output lines)",
    WORKER_RANK: "workers: the same as RANK",
    SERVER_RANK: "servers: 0..M-1",
    WORKERS: "number of workers",
    SERVERS: "number of parameter servers (0 in allreduce mode)",
    MODE: "ps or allreduce",
    POLICY: "vanilla, slicing, endhost or geryon",
    PRIORITY: "coarse, search or threshold=T",
    CLASSES: "priority classes 'name:dscp,...' (empty: the default two)",
    JOB_ID: "this job's id (also the emulated cluster's name)",
    JOB_SECRET: "a per-job secret; the transport authenticates its connections with it",
    BACKEND: "local, emulate or ssh",
    HOST_IP: "the address this rank should bind its geryon flows to",
    IFACE: "the interface of that address, when known",
    TIMELINE: "where the job's trace goes (empty: no trace)",
    STORE_PREFIX: "key prefix in the TCPStore reserved for geryon's own rendezvous",
    PS_OPTIMIZER: "ps mode: auto, server or worker (who runs the optimizer)",
    PS_PULL: "ps mode: auto, end or ahead (when a worker asks for the next parameters)",
    PS_PLACEMENT: "ps mode: bytes or count (how slices are dealt over the servers)",
    SERVER_DEVICE: "ps mode: cpu or cuda (where each server holds its shards and runs the optimizer)",
    COLLECTIVES: "allreduce mode: geryon, nccl, nccl-ib:SL,... or gloo-classes (what carries the buckets)",
    OVERLAP: "allreduce mode: barrier or next-forward (when each parameter is updated)",
    PLAIN_DDP: "1: allreduce mode without geryon's transport (the script's own DDP over gloo, as torchrun)",
    SYNC: "allreduce mode: full, partial[:P] or partial-static[:P] (how workers average)",
    STRAGGLER: "RANK:FACTOR: that worker sleeps (FACTOR - 1) x its compute after each step (empty: none)",
    TLS_FILE: "--tls: a 0600 file with the job's TLS key and certificate (PEM)",
    TLS_CREDENTIALS: "--tls over SSH: the job's TLS key and certificate, base64 PEM (sent on stdin)",
    RESTART_COUNT: "how many times the launcher restarted the job (0 at the first start)",
    PS_CHECKPOINT_EVERY: "ps mode: the servers checkpoint every K steps (0: never)",
    PS_CHECKPOINT_DIR: "ps mode: the directory of the servers' checkpoints (empty: none)",
}

# -- inherited by ranks from the launcher's environment (no flag) ---------------------------------------
TRANSPORT_TIMEOUT = "GERYON_TRANSPORT_TIMEOUT"   # seconds without progress before a peer counts as dead
CONNECT_TIMEOUT = "GERYON_CONNECT_TIMEOUT"   # seconds a rank waits for its peers at the start (default: the above)
THREAD_RT = "GERYON_THREAD_RT"   # SCHED_RR priority of the transport's threads (TransportConfig.thread_rt_priority)
SEARCH_CANDIDATES = "GERYON_SEARCH_CANDIDATES"   # --priority search settings (geryon.runtime.search_sync)
SEARCH_ITERS = "GERYON_SEARCH_ITERS"
SEARCH_WARMUP = "GERYON_SEARCH_WARMUP"
SEARCH_BUDGET = "GERYON_SEARCH_BUDGET"
SEARCH_FIRST_ROUND = "GERYON_SEARCH_FIRST_ROUND"
SEARCH_CLASSES = "GERYON_SEARCH_CLASSES"         # K: the search chooses K-1 thresholds (--max-classes K)
SEARCH_METHOD = "GERYON_SEARCH_METHOD"           # fit or gp
SEARCH_CONFIRM = "GERYON_SEARCH_CONFIRM"         # last probes re-measuring the best two
SEARCH_RUN = "GERYON_SEARCH_RUN"
SEARCH_VARIABLES = (SEARCH_CANDIDATES, SEARCH_ITERS, SEARCH_WARMUP, SEARCH_BUDGET, SEARCH_FIRST_ROUND,
                    SEARCH_CLASSES, SEARCH_METHOD, SEARCH_CONFIRM)

# -- tools outside a job ----------------------------------------------------------------------------------
PROFILES = "GERYON_PROFILES"     # a directory of per-layer .dag profiles (else the packaged ones)
STATE_DIR = "GERYON_STATE_DIR"   # where emulate/netconf keep their state (geryon.netnames.state_base)

# -- defaults both halves agree on ------------------------------------------------------------------------
DEFAULT_POLICY = "geryon"
DEFAULT_STORE_PREFIX = "geryon/"
DEFAULT_TRANSPORT_TIMEOUT_S = 60.0

# the line an SSH-started rank's shell prints first, so the launcher knows the remote PID
REMOTE_PID_MARK = "GERYON_REMOTE_PID="
