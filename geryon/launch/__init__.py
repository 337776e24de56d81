"""geryon.launch: run a PyTorch training script as a distributed job, urgent parameters first.

Usage
-----
    python -m geryon.launch [--mode ps|allreduce] [--workers N | --nproc-per-node N] [--servers M]
                            [--policy vanilla|slicing|endhost|geryon]
                            [--priority coarse|search|threshold=T] [--classes SPEC]
                            [--max-classes K] [--tenants FILE --tenant NAME]
                            [--emulate [--bw RATE] [--topology star|leafspine]] [--local]
                            [--hostfile FILE [--known-hosts FILE]]
                            [--timeline FILE] [--timeout S] [--grace S]
                            [--ps-optimizer auto|server|worker]
                            [--ps-pull auto|end|ahead] [--ps-placement bytes|count] [--tls]
                            [--collectives geryon|nccl|nccl-ib:SL,...|gloo-classes]
                            [--overlap barrier|next-forward] [--plain-ddp]
                            [--max-restarts N]
                            [--ps-checkpoint-every K --ps-checkpoint-dir DIR]
                            [--sync full|partial[:P]|partial-static[:P]] [--straggler RANK:FACTOR]
                            [--start exec|fork]
                            SCRIPT [ARGS...]

It feels like torchrun: the script is started once per worker, and sees the usual variables
(`--nproc-per-node N` / `--nproc_per_node N`, torchrun's spelling, is accepted for --workers N).
Inside the script two lines make it distributed (see geryon.runtime.api)::

    ctx = geryon.init()
    model, optimizer = geryon.distribute(model, optimizer)   # + DDP's options, e.g. static_graph=True

DDP compatibility (which DDP options and features each mode keeps: no_sync, unused parameters,
static graph, autocast, SyncBatchNorm, torch.compile, checkpoints, join) is tabulated, cell by
tested cell, in docs/ddp-compat.md.

Backends (one launcher, three ways to start processes)
------------------------------------------------------
  --local      child processes on this machine, talking over loopback (local_run.py).
  --emulate    an emulated cluster built for the job: one host (network namespace) per rank behind a
               switch with priority queues at --bw (default 100mbit), removed after the job
               (emulate_run.py). Needs root.
  --hostfile   real hosts over SSH (ssh_run.py), one per line: `host[:port] [slots=N] [user=U]
               [key=PATH] [iface=NAME] [python=PATH]`. Host keys are checked against --known-hosts
               (default ~/.ssh/known_hosts); an unknown or changed key is an error, never accepted.
               Server j runs on host j; workers fill the hosts' slots in order. The script path,
               the working directory and the interpreter must be the same on every host.
  With none of them: --emulate when run as root, else --local.

Starting ranks (--start; details in geryon/launch/template.py)
--------------------------------------------------------------
  exec   every rank is a new interpreter: `python -u SCRIPT ARGS`, a server `python -u -m
         geryon.runtime.server` (the default; SSH ranks always start so).
  fork   the launcher imports torch once and forks a template before it starts any thread; each
         --local or --emulate rank is forked from it, takes its environment, streams, argv and
         network namespace, and runs SCRIPT as __main__ with the interpreter's exit codes, atexit
         handlers and joined threads. A rank then starts without importing torch (about a
         CPU-second per rank on a small machine): for many short jobs, such as sweeps and tests.
         Its process name is the rank's (worker0, server1); its /proc/PID/cmdline and environ
         stay the launcher's.

TLS (--tls)
-----------
  Every data flow runs TLS 1.3 with a key and self-signed certificate made for the job, which every rank
  presents and checks its peers' against (GERYON_TLS_FILE, a 0600 file the launcher removes after the
  job; over SSH the same on the rank's stdin). The job secret's handshake still runs inside. The store's
  values are signed, not encrypted. Details: docs/security.md.

Jobs sharing a fabric (--tenants FILE --tenant NAME; details in docs/tenants.md)
---------------------------------------------------------------------------------
A tenants file lists the jobs on one fabric (and optionally their weights); `geryon netconf` renders it
as fabric classes for the switches. --tenant NAME puts this job's high class on its urgent level's DSCP
and its low class on bulk's, in place of --classes.

Collectives in allreduce mode (--collectives; details in docs/nccl.md)
---------------------------------------------------------------------
What carries the gradient buckets, each bucket in its priority class (the same hook, classes and
--priority search for every choice). Named --collectives because the backends above are how processes
are started, a different choice.
  geryon        geryon's ring allreduce over its per-class TCP flows, marked with each class's DSCP
                (the default).
  nccl          one NCCL process group per class, each created with its own traffic class: the
                class's DSCP << 2, the IP TOS byte on RoCE. Needs NCCL >= 2.26 and a PyTorch with
                ProcessGroupNCCL.Options().config.traffic_class; a rank stops with an error naming
                what is missing. NCCL_IB_TC / NCCL_IB_SL override every group's class inside NCCL:
                each rank warns when it finds one.
  nccl-ib:S,... the same on InfiniBand: one service level (0-15) per class, most urgent first.
  gloo-classes  one gloo group per class; gloo cannot mark packets, so the classes get their own
                connections and queues on the hosts but look alike to the network.
  Refused with --mode ps, a --policy other than geryon, or --tls.

Slow workers (--sync, --straggler; details in docs/partial-allreduce.md)
-----------------------------------------------------------------------
  --sync full              every worker averages every gradient each iteration (allreduce mode's
                           default): the job runs at the pace of its slowest worker.
  --sync partial[:P]       Ripples' partial allreduce: after each local step a worker averages its
                           model with a group of P workers (default 4), groups formed from the
                           workers ready first, so a slow worker holds back only the group it joins.
                           Call geryon.average_replicas() before evaluating or saving: every worker
                           then averages with all the others and the replicas are equal (it also
                           runs at exit).
  --sync partial-static[:P] the same with a fixed schedule of groups, for workers alike.
  --straggler RANK:FACTOR  worker RANK sleeps FACTOR - 1 times its compute after each step: a slow
                           worker to reproduce, in any mode.
  --sync partial is refused with --mode ps and with --collectives other than geryon.

Definitions
-----------
  worker   a process running SCRIPT; workers are RANK 0..N-1 and WORLD_SIZE is N.
  server   a parameter server (--mode ps only; default 1), run as `python -m geryon.runtime.server`.
  policy   vanilla: FIFO everywhere; slicing: parameters sliced, no priority; endhost: priority at
           the senders only; geryon: priority classes marked with DSCP and queued by priority in
           the network (the emulated cluster gets priority queues only for this policy).

Environment
-----------
Every flag has a twin, read when the flag is absent: GERYON_MODE, GERYON_WORKERS, GERYON_SERVERS,
GERYON_POLICY, GERYON_PRIORITY, GERYON_CLASSES, GERYON_EMULATE, GERYON_BW, GERYON_TOPOLOGY,
GERYON_LOCAL, GERYON_HOSTFILE, GERYON_KNOWN_HOSTS, GERYON_TIMELINE, GERYON_TIMEOUT, GERYON_GRACE,
GERYON_PS_OPTIMIZER, GERYON_PS_PULL, GERYON_PS_PLACEMENT, GERYON_SERVER_DEVICE, GERYON_TLS, GERYON_COLLECTIVES,
GERYON_MAX_RESTARTS, GERYON_PS_CHECKPOINT_EVERY, GERYON_PS_CHECKPOINT_DIR, GERYON_OVERLAP,
GERYON_PLAIN_DDP, GERYON_SYNC, GERYON_STRAGGLER, GERYON_START.

Ranks see RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a TCPStore
the launcher hosts; TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun), and GERYON_ROLE,
GERYON_RANK_NAME, GERYON_WORKER_RANK / GERYON_SERVER_RANK, GERYON_WORKERS, GERYON_SERVERS,
GERYON_MODE, GERYON_POLICY, GERYON_PRIORITY, GERYON_CLASSES, GERYON_JOB_ID, GERYON_JOB_SECRET (for
the transport to authenticate its connections), GERYON_BACKEND, GERYON_HOST_IP, GERYON_IFACE,
GERYON_TIMELINE, GERYON_STORE_PREFIX, GERYON_COLLECTIVES, GERYON_SYNC, GERYON_STRAGGLER,
GERYON_RESTART_COUNT and torchrun's TORCHELASTIC_RESTART_COUNT (0 at the first start, n after the
n-th restart), GERYON_PS_CHECKPOINT_EVERY, GERYON_PS_CHECKPOINT_DIR, with --tls GERYON_TLS_FILE or
GERYON_TLS_CREDENTIALS (see geryon.envvars.JOB_VARIABLES).
GERYON_TRANSPORT_TIMEOUT (inherited, not a flag): seconds without progress before the transport
declares a peer dead (default 60).
GERYON_CONNECT_TIMEOUT (inherited, not a flag): seconds a rank waits for its peers to come up when the
job starts (TransportConfig.connect_timeout; default GERYON_TRANSPORT_TIMEOUT), so a short transport
timeout finds a dead peer quickly without failing ranks that start a few seconds apart.
GERYON_THREAD_RT (inherited, not a flag): SCHED_RR priority P of the transport's threads, class c at
P - c (TransportConfig.thread_rt_priority; default 0, off): where many ranks share a host's cores (the
emulated cluster), frames are sent and received as they arrive, the urgent class first.

Priority classes (--priority)
-----------------------------
  coarse       everything before the first fully-connected layer is class 0 (default).
  threshold=T  one threshold T in [0, 1] over the urgency order (fraction of the tensors).
  search       T is searched during the first iterations of the real job, then kept
               (geryon.runtime.search_sync): candidates are tried one after another for a few
               iterations each (the first of each probe discarded as warm-up); every worker times
               each iteration (between successive optimizer steps), rank 0 reduces the times (max
               over ranks) through the store, fits them and decides, and every rank (and in ps mode
               every server) switches classes at the same iteration boundary, without restarting
               and without losing or repeating an update. Rank 0 prints the chosen threshold and
               writes RUN.json for `geryon report threshold RUN.json`. Inherited variables:
    GERYON_SEARCH_CANDIDATES  comma-separated thresholds (default 0, 0.05, ..., 1)
    GERYON_SEARCH_ITERS       iterations per probe (default 5)
    GERYON_SEARCH_WARMUP      iterations discarded at the start of each probe (default 1)
    GERYON_SEARCH_BUDGET      probes in all (default 10)
    GERYON_SEARCH_FIRST_ROUND evenly spaced probes before refining (default 6)
    GERYON_SEARCH_METHOD      fit (robust spline; default for 2 classes) or gp (Gaussian process)
    GERYON_SEARCH_CONFIRM     last probes re-measuring the best two (default 2)
    GERYON_SEARCH_RUN         the RUN.json path (default: FILE's stem + .RUN.json next to
                              --timeline FILE, else RUN.json in the workers' working directory)
  With the defaults the search spends 10 probes x 5 iterations = 50 iterations; train longer
  than that, or the search ends with the job (no RUN.json).
  --max-classes K (GERYON_MAX_CLASSES) searches K-1 thresholds over K classes (a Gaussian process
  over the pairs for K = 3; 10 + 6(K-2) probes, 80 iterations for K = 3) and gives the transport and
  the emulated switches K classes unless --classes names at least K; the report is a heat-map.

Transport and timeline
----------------------
geryon.runtime.api moves the job's gradients and parameters over geryon.transport: in allreduce mode a DDP
comm hook (geryon.runtime.ddp_sync), or with --overlap next-forward (GERYON_OVERLAP) per-bucket reductions
whose parameters are updated as each lands, the next forward waiting per layer for its own
(geryon.runtime.ddp_overlap, docs/allreduce-overlap.md), or with --plain-ddp nothing of geryon's: the
script's DistributedDataParallel over gloo, as torchrun runs it (the baseline `geryon demo` compares
with); in ps mode `python -m geryon.runtime.server` runs a
ParameterServer and the workers' optimizer step pushes and pulls (geryon.runtime.ps_sync). Priority
classes come from the model's urgency ranking on its first forward call (geryon.runtime.priorities).
--timeline FILE: every rank writes FILE.<rank>.part.json at exit and the launcher merges the parts
into FILE when the job ends (on SSH hosts only parts on a shared filesystem can be merged).

The optimizer in ps mode (--ps-optimizer; details in docs/ps-optimizers.md)
---------------------------------------------------------------------------
PS training follows one process on the concatenated batch, whatever the optimizer:
  server   (auto for SGD, Adam, AdamW, Adamax, NAdam, RAdam, RMSprop, Adagrad, Adadelta, Rprop, ASGD
           -- the exact torch.optim classes, whose update is elementwise) every server runs the
           user's own torch.optim class over its slices, one group per parameter group with every
           hyper-parameter; the optimizer travels as JSON (class name from that allow-list, group
           settings), never pickled. Each step() sends the groups' current numbers, so
           lr_scheduler, warm-up and manual edits apply at the next update; the returned optimizer
           is a torch.optim.Optimizer sharing the user's param_groups (schedulers made before or
           after distribute() work, without warnings). state_dict() gathers the state from the
           servers in torch's format; load_state_dict() (on every worker, as with DDP) sends it
           and the model's current parameters back; so does model.load_state_dict().
  worker   (auto for anything else: LAMB, LARS, Adafactor, subclasses, tensor hyper-parameters)
           the servers average gradients, .grad holds the average when backward returns, and
           every worker runs the user's optimizer itself (as BytePS does).
  The choice is printed by worker 0; --ps-optimizer server|worker (GERYON_PS_OPTIMIZER) forces it.
  --ps-pull end|ahead (GERYON_PS_PULL): ask for the next parameters at step() or with the first
  gradient of backward, so each comes back as soon as its update is made (bit-equal results;
  refused with global-norm clipping or settings changed between backward and step()). Default
  auto: ahead when the workers step, end when the servers do.
  --ps-placement bytes|count (GERYON_PS_PLACEMENT): every tensor is cut into slices, and each
  slice goes to the server holding the fewest bytes so far (bytes, the default) or round-robin
  (count, P3's way, which gives one server all the weights and another all the biases when
  they alternate). Every rank and server must agree; the plan digest checks it.
  --server-device cpu|cuda (GERYON_SERVER_DEVICE): where each server holds its shards and runs the
  optimizer, the CPU (the default: servers on CPU hosts) or its GPU. Workers' models may be on GPUs
  either way: their gradients and parameters cross through pinned host memory (docs/gpu.md).
  Clipping: geryon.clip_grad_norm_(optimizer, max_norm) (or optimizer.clip_grad_norm_(max_norm)
  when the servers step) clips by the norm of the averaged gradient over all parameters, as one
  process: the servers compute it from their averaged slices (partial sums shared through the
  store) before updating. With the workers stepping, torch.nn.utils.clip_grad_norm_ itself is exact.
  torch's clip_grad_norm_ (or any edit of .grad after backward) while the servers step would be
  lost, so step() stops with an error saying what to use.
  Buffers (BatchNorm statistics) follow DDP: worker 0's are broadcast before every training forward;
  SyncBatchNorm on CPU is refused by distribute() (PyTorch runs it on GPUs only; docs/ddp-compat.md).
  Refused before the first step, with what to do: LBFGS,
  SparseAdam, --ps-optimizer server for an optimizer the servers cannot run, new parameter groups
  or changed non-numeric settings after the first forward, an optimizer over tensors the model does
  not have, --priority search with the workers stepping.

Output and failures
-------------------
Each rank's output lines are streamed with its name as prefix: `[worker0] loss 2.30`. The job
succeeds when every worker exits 0 (servers are then stopped). When a rank exits non-zero, or a
server quits while workers still run, every other rank gets SIGTERM, then SIGKILL after --grace
seconds (default 5), and the launcher exits with that rank's exit code (128+N if it was killed by
signal N) after printing its last lines. --timeout S stops the job after S seconds (exit 124).
Ctrl-C or SIGTERM to the launcher stops every rank the same way, removes the emulated cluster, and
exits 130. Bad input (a missing script, a bad hostfile line, an unknown host, more servers than hosts,
an unknown policy, a bad rate) is reported before anything starts, with exit code 2.

Recovery (--max-restarts, --ps-checkpoint-every)
------------------------------------------------
--max-restarts N (GERYON_MAX_RESTARTS; default 0): as under torchrun, when a rank or server fails (a
non-zero exit, a signal, a server quitting while workers run), every rank is stopped as above and then
the whole job starts again: every worker and server on the same placement (the same hosts; a fresh
emulated cluster of the same shape), with a fresh store, job secret and TLS credentials. Ranks tell
which start they are in from GERYON_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT (ctx.restart_count).
After N restarts a job that still fails stops with the last failure's message and "gave up after N
restarts", and its exit code. A timeout or an interrupt is never restarted; --timeout counts over all
starts.
A restart begins where the job's state was saved: in allreduce mode the script's own checkpoint (e.g.
examples/train_resnet.py --checkpoint-dir DIR --checkpoint-every K --resume latest); in ps mode the
servers' own checkpoints: --ps-checkpoint-every K --ps-checkpoint-dir DIR (GERYON_PS_CHECKPOINT_EVERY,
GERYON_PS_CHECKPOINT_DIR; ps mode, with the servers running the optimizer): after every K-th step each
server writes its shards' values, optimizer state and version to DIR, atomically (a temporary file,
fsync, rename), one file per server and step, and worker 0 then writes the model's buffers (BatchNorm
statistics) and the step's marker. The workers' step count is the version.
Consistency rule: a step S is consistent when its marker and every server's file of S exist; a server
writes its file only when every shard it holds is at version S, so every shard of a consistent step is
at the same version S. DIR keeps the last two consistent steps. A job that starts (first start or
restart) with a consistent step in DIR resumes from the latest one: the servers load it, the workers
pull it and count on from it, and the script learns it from ctx.resumed_step (geryon.init()), to skip
the data of steps 0..S-1 and to advance anything else that counts steps (an lr scheduler: call its
step() S times) -- the optimizer's own state comes from the servers, not from a user checkpoint.
An empty DIR starts afresh. Every rank reads DIR at start, the servers and worker 0 write it: it must
be the same directory for all of them (over SSH: a shared filesystem). Refused before start: --ps-checkpoint-every
without --ps-checkpoint-dir (or the reverse), in allreduce mode, with --ps-optimizer worker (the
optimizer state lives in the workers; when auto chooses it, the workers stop at the first forward),
and with --priority search.
"""

from geryon.launch.config import LaunchConfig, parse_launch_args
from geryon.launch.launcher import main, run

__all__ = ["LaunchConfig", "parse_launch_args", "run", "main"]
