"""Lab 01: quantization. Write INT4 group-wise quantization and GPTQ's inner loop.

Storage you produce (the layout inferlab's Int4Linear and its W4A16 kernel read):
    qweight  uint8   [out, in // 2]   byte [n, j] = q[n, 2j] | q[n, 2j + 1] << 4   (low nibble = even column)
    scales   float16 [out, in // G]   one per group of G consecutive input columns
    zeros    uint8   [out, in // G]   the code that stands for 0.0
    w[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G]

Grade your work with `inferlab grade labs/01_quantization`. Keep the names and signatures.
"""
import torch


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes [out, in] (values 0..15) -> uint8 [out, in // 2], two codes per byte, even column low."""
    raise NotImplementedError("about 2 lines")


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in // 2] -> codes [out, in] (uint8): the inverse of pack_int4."""
    raise NotImplementedError("about 1 line: torch.stack(..., dim=-1).flatten(-2)")


def group_qparams(w: torch.Tensor, bits: int, sym: bool = False):
    """(scale, zero) for each row of ``w`` [..., G], asymmetric min/max (sym: see the README).

    The range always includes 0 (lo = min(w.min, 0), hi = max(w.max, 0)); scale = (hi - lo) / (2^bits - 1)
    (use 1.0 where it would be 0); zero = round(-lo / scale) clamped to 0 .. 2^bits - 1.
    """
    raise NotImplementedError("about 10 lines")


def quantize_int4(w: torch.Tensor, group_size: int = 128, bits: int = 4, sym: bool = False):
    """Round-to-nearest, group-wise: w [out, in] float -> (qweight, scales, zeros) as above.

    Round the scale to float16 *before* computing the codes (it is stored in fp16), and
    q = clamp(round(w / scale) + zero, 0, 2^bits - 1).
    """
    raise NotImplementedError("about 8 lines: reshape to [out, in // G, G], group_qparams, pack_int4")


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """(qweight, scales, zeros) -> float32 w [out, in] with the formula above."""
    raise NotImplementedError("about 4 lines")


def hessian_inverse_cholesky(H: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp * mean(diag H) * I)^-1.

    torch.linalg.cholesky, torch.cholesky_inverse and torch.linalg.cholesky(..., upper=True).
    """
    raise NotImplementedError("about 3 lines")


def gptq_inner_loop(W: torch.Tensor, Hinv: torch.Tensor, bits: int = 4, group_size: int = 128):
    """GPTQ's column loop. W [out, in], Hinv = hessian_inverse_cholesky(H) [in, in].

    For each column j in order:
      - at the start of each group (j % group_size == 0): fit (scale, zero) with group_qparams on the
        *current* (already error-updated) columns j .. j + group_size, and round scale to float16;
      - q_j = clamp(round(W[:, j] / scale) + zero, 0, 2^bits - 1);  dq_j = (q_j - zero) * scale
      - err = (W[:, j] - dq_j) / Hinv[j, j]
      - W[:, j:] -= err[:, None] * Hinv[j, j:][None, :]       (push the error onto later columns)
    Return (codes uint8 [out, in], scales fp16 [out, in // G], zeros uint8 [out, in // G]).
    (The paper's lazy batches give the same result, faster; a plain loop is fine here.)
    """
    raise NotImplementedError("about 15 lines")
