"""Priority queues on network interfaces: what the switch and hosts do with DSCP marks.

Owns, for one interface at a time: the priority classes (name + DSCP, strict order), the tc plan that
implements them (HTB with u32 DSCP filters, or prio/ets where the kernel has them), applying and removing
it, reading per-class counters back, detecting what the kernel offers, and sniffing marks on the wire.
Knows nothing of training, transport or the emulated cluster; they call it.

  classes       PriorityClass, default_classes, parse_classes
  plan          QueuePlan and its operations, built as data (`geryon netconf show` prints them)
  capabilities  which qdiscs/classifiers exist, probed in a throw-away namespace
  apply         install_priority_queues, install_shaping, remove_queues (the only module that writes)
  counters      read_class_counters -> ClassCounters per class
  state         the sidecar that remembers class names for later readers
  verify        DscpSniffer: packets and bytes per (source, DSCP) seen on an interface
  sniff         the capture process DscpSniffer starts inside the namespace (scapy)

Switch QoS profiles (docs/switch-qos.md), imported by their users, not here:
  qos_profile   QosProfile: classes with DSCPs, queue, strict/weighted; TOML, built-ins, --classes; limits
  render/       one renderer per target: linux, sonic, openconfig, eos, nxos, nvue, junos
  remote        Endpoint (KIND@HOST) and SshShell (paramiko, known_hosts enforced)
  tcstate       a Linux device's tc state: dump, canonical form, restore commands
  linuxapply    apply a profile to Linux over SSH: save, diff, apply, read back, roll back; restore
  session       vendor sessions with each platform's safety net, shown (--dry-run) or run over SSH
"""

from geryon.netconf.apply import apply_plan, install_priority_queues, install_shaping, remove_queues
from geryon.netconf.capabilities import Capabilities, detect_capabilities
from geryon.netconf.classes import (MAX_CLASSES, PriorityClass, default_classes, format_classes,
                                    parse_classes, validate_classes)
from geryon.netconf.counters import ClassCounters, counters_by_name, read_class_counters
from geryon.netconf.plan import (AckFilterOp, ClassOp, FilterOp, QdiscOp, QueuePlan, build_priority_plan,
                                 build_shaping_plan)
from geryon.netconf.state import forget_netns_state
from geryon.netconf.verify import DscpSniffer, MarkCount, SniffResult, sniff_dscp

__all__ = [
    "MAX_CLASSES", "PriorityClass", "default_classes", "parse_classes", "validate_classes", "format_classes",
    "QueuePlan", "QdiscOp", "ClassOp", "FilterOp", "AckFilterOp", "build_priority_plan", "build_shaping_plan",
    "Capabilities", "detect_capabilities",
    "install_priority_queues", "install_shaping", "remove_queues", "apply_plan",
    "ClassCounters", "read_class_counters", "counters_by_name", "forget_netns_state",
    "DscpSniffer", "SniffResult", "MarkCount", "sniff_dscp",
]
