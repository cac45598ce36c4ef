"""Lab 09: tensor parallelism. Write the three forwards below.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits every weight matrix across N ranks
(processes, one per GPU). A linear computes y = x @ W.T + b with W of shape [out, in]:

- column-parallel: a rank holds some ROWS of W (some output features) and the matching slice of b;
  from the whole x it computes its slice of y. No communication.
- row-parallel: a rank holds some COLUMNS of W (some input features) and the matching slice of x
  (exactly what the column-parallel layer before it produced); it computes a partial sum of the
  whole y, and an all-reduce adds the N partial sums. The bias (whole, on every rank) is added once.
- vocab-parallel embedding: a rank holds rows [start, start + rows) of the [vocab, dim] table; it
  looks up the ids it owns, writes zeros for the others, and an all-reduce sums the ranks.

`all_reduce(t)` sums t over the ranks and returns the result (every rank gets the same tensor).
The grader runs your functions on 2 real processes (gloo) and compares with the unsplit layer.
Grade your work with `inferlab grade labs/09_tensor_parallelism`. Keep the names and signatures.
"""
import torch
import torch.nn.functional as F


def column_parallel_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in], weight [out/N, in] (this rank's rows of W), bias [out/N] or None -> [..., out/N].

    This rank's slice of y = x @ W.T + b. Do not communicate.
    """
    raise NotImplementedError("about 1 line")


def row_parallel_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         all_reduce=None) -> torch.Tensor:
    """x [..., in/N] (this rank's input features), weight [out, in/N] (the matching columns of W),
    bias [out] (the whole bias) or None -> [..., out], the whole y = x_full @ W.T + b on every rank.

    Call all_reduce exactly once. Add the bias after the sum: added before, N ranks add it N times.
    """
    raise NotImplementedError("about 2 lines")


def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, start: int, all_reduce=None) -> torch.Tensor:
    """ids [...] (any token ids of the whole vocabulary), weight [rows, dim] (rows start..start+rows-1
    of the table), start (the first id this rank owns) -> [..., dim], the full embedding on every rank.

    An id this rank does not own must not index weight (it may be out of range, or land on another
    token's row): look up a safe row for it, then zero it. Call all_reduce exactly once.
    """
    raise NotImplementedError("about 4 lines")
