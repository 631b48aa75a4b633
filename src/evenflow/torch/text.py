"""A packing-aware text classifier for PyTorch: :func:`packed_text_cnn`.

It reads the batches of :mod:`evenflow.data.packed` — ``tokens``, ``segment_ids`` ``[rows,
L]`` — and returns logits ``[slots, classes]``, one row per sample, in the batch's slot
order. Every convolution tap that would reach into another sample (or padding) reads
zero instead, exactly what a convolution's zero padding feeds at a sequence's own ends,
and each sample is pooled (mean and max) over its own tokens only. So a sample's logits
are the same whether it is packed alone, with other samples, or padded in a batch of its
own: packing changes how much padding is computed, never a prediction.
"""
from __future__ import annotations

from evenflow.data.packed import check_text_cnn
from evenflow.torch._lazy import torch as _torch


def packed_text_cnn(num_classes: int, vocab_size: int = 257, embed: int = 32, width: int = 64, kernel: int = 5):
    """A ``PackedTextCNN`` (``torch.nn.Module``); call it as ``model(tokens, segment_ids, slots)``.

    Raises:
        ValueError: a size that is not an int >= 1, or an even ``kernel`` (see
            :func:`evenflow.data.packed.check_text_cnn`).
    """
    num_classes, vocab_size, embed, width, kernel = check_text_cnn(num_classes, vocab_size, embed, width, kernel)
    torch = _torch()
    nn = torch.nn

    class PackedTextCNN(nn.Module):
        """Embedding, two segment-masked 1-D convolutions, per-sample mean and max pooling, logits."""

        def __init__(self):
            super().__init__()
            self.kernel = kernel
            self.embed = nn.Embedding(vocab_size, embed, padding_idx=0)
            self.conv1 = nn.Linear(kernel * embed, width)
            self.conv2 = nn.Linear(kernel * width, width)
            self.logits = nn.Linear(2 * width, num_classes)

        def _conv(self, layer, x, same):
            # x [rows, L, C] -> the kernel's window of every position [rows, L, kernel * C], taps outside
            # the position's own segment zeroed, then one matmul.
            half = self.kernel // 2
            padded = nn.functional.pad(x, (0, 0, half, half))
            windows = padded.unfold(1, self.kernel, 1)  # [rows, L, C, kernel]
            windows = windows * same[:, :, None, :]
            return torch.relu(layer(windows.transpose(2, 3).reshape(x.shape[0], x.shape[1], -1)))

        def forward(self, tokens, segment_ids, slots: int):
            half = self.kernel // 2
            seg = segment_ids.long()
            if seg.device.type == "cpu" and seg.numel() and not torch.compiler.is_compiling() and \
                    int(seg.max()) > slots:  # its samples past `slots` would be pooled into no slot
                raise ValueError(f"the batch holds segments up to {int(seg.max())} but slots is {slots}: pass the "
                                 f"batch's number of slots (the length of its label)")
            padded = nn.functional.pad(seg, (half, half))
            same = (padded.unfold(1, self.kernel, 1) == seg[:, :, None]) & (seg[:, :, None] > 0)
            same = same.to(torch.float32)
            h = self._conv(self.conv1, self.embed(tokens.long()), same)
            h = self._conv(self.conv2, h, same)
            # Pool per sample: padding goes to one extra bucket (index `slots`) that is dropped, so no
            # shape depends on the data (a compiler sees the same graph for every batch of one shape).
            h = h.reshape(-1, h.shape[-1])
            bucket = torch.where(seg > 0, seg - 1, slots).reshape(-1)
            index = bucket[:, None].expand(-1, h.shape[-1])
            count = torch.zeros(slots + 1, dtype=h.dtype, device=h.device).index_add_(
                0, bucket, torch.ones_like(bucket, dtype=h.dtype))[:slots]
            total = torch.zeros(slots + 1, h.shape[-1], dtype=h.dtype, device=h.device).scatter_add(0, index, h)
            mean = total[:slots] / count.clamp(min=1)[:, None]
            top = torch.zeros(slots + 1, h.shape[-1], dtype=h.dtype, device=h.device).scatter_reduce(
                0, index, h, reduce="amax", include_self=False)[:slots]
            return self.logits(torch.cat([mean, top], dim=1))

    return PackedTextCNN()

