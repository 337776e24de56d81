"""Flow-level simulator of PS training under geryon's policies (`geryon sim`).

fabric.py  the network: host/leaf links, flow groups, strict priority + max-min allocation
workload.py slices, servers, classes and send order of a model under a policy (mirrors transport)
job.py     the event-driven synchronous PS job (aggregate or exact per-connection)
scenario.py one setting as data; simulate, the slides' analytic estimate, calibration
paper.py   the paper's figures; report.py tables and charts; compare.py validation against
           `bench paper` rows; whatif.py the what-if sweeps; ns3ref.py the ns-3 packet-level check
"""
