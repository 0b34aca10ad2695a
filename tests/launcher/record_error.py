"""A worker whose rank 1 raises under PyTorch's @record, which writes the exception to the
file named by TORCHELASTIC_ERROR_FILE; ddprun must show its message in the failure summary."""
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one could not load its shard")


main()
