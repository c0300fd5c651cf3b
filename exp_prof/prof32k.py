import sys, torch
sys.path[:0] = [".", "suites"]
import kernels
from kernels import decode as dec
from decode_support import random_kv, random_q
k, v = random_kv(1, 32, 32768, 128, device="cuda", seed=5)
q = random_q(1, 32, 128, device="cuda", seed=6)
cache = kernels.quantize_kv(k, v, 3, backend="triton")
for _ in range(4):
    dec.decode_attention(q, cache)
torch.cuda.synchronize()
