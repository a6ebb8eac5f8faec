"""The wire: allreduce algorithms and sums built from torch.distributed's point-to-point primitives, written as
steps that can be pipelined, the node topology they run in, and the sparse allgather."""
