"""Multi-node (SPEC §8): one supervisor per node, agreeing through a TCPStore on node 0.

store.py (the store, quiet and typed), join.py (who is in the run), liveness.py (who is still
there, pure), summary.py (heartbeats and node 0's summary: O(nodes) traffic, pure), views.py
(rank details, only for nodes that show them), traffic.py (what a node writes and reads),
link.py (the running control plane: stop records, heartbeats, remote ranks),
agreement.py (one verdict and one envelope for every node), slurm.py (configuration from an
srun step). torch is imported only here, and only when a run has more than one node.
"""
