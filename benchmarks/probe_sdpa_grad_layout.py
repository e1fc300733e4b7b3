"""The layout in which scaled_dot_product_attention's backward returns dq, dk, dv (CUDA, bf16, ViT-B's
attention shape): with q, k, v as views of one (B, N, 3C) buffer, and as three dense (B, N, C) tensors.
(benchmarks/README.md v25: whether a qkv layer with three outputs would receive its gradients without a
copy.)"""

import torch
import torch.nn.functional as F


def main() -> None:
    B, N, H, hd = 128, 197, 12, 64
    qkv = torch.randn(B, N, 3 * H * hd, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.transpose(1, 2) for t in qkv.view(B, N, 3, H, hd).unbind(2))
    qs = [t.detach().requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*qs)
    o.backward(torch.randn_like(o))
    print("q strides", [t.stride() for t in qs])
    print("grad strides", [t.grad.stride() for t in qs])
    views = [t.grad.transpose(1, 2).is_contiguous() for t in qs]
    print("grad as (B,N,C) contiguous:", views)
    sep = [torch.randn(B, N, H * hd, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    qs2 = [t.view(B, N, H, hd).transpose(1, 2).detach().requires_grad_() for t in sep]
    o2 = F.scaled_dot_product_attention(*qs2)
    o2.backward(torch.randn_like(o2))
    print("separate: q strides", [t.stride() for t in qs2], "grad strides", [t.grad.stride() for t in qs2])
    print(torch.__version__, torch.backends.cudnn.version())


if __name__ == "__main__":
    main()
