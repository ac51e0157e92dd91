"""The cupy pool's fingerprint kernel: the whole definition (fingerprint.py) in one pass.

The float32 GEMMs that every backend can run read each byte eight times as a float and
leave P in memory for the second stage; on an H200 that audits a 40 GB pool at about
134 GB/s. This CUDA kernel reads each 4,096-byte row once as sixteen-byte words, forms
P[r, k] with __dp4a (four int8 products summed into an int32), sums the threads' parts
with a butterfly across each warp (nine shuffles for all eight k, not forty), and folds
P into A and B in 64-bit integers, each warp on its own, before it writes two numbers
per block: 2.5 TB/s on the same pool (docs/gpu.md). The integers are those of the
definition, so the bits are too; the pool still checks that on random blocks before it
trusts the kernel (`Dp4aFingerprint.load`), and falls back to the GEMMs when the kernel
does not build or does not agree.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Final

import numpy as np

from kvoracle.kvcache.pool.fingerprint import _Scheme, _np_halves

if TYPE_CHECKING:
    from kvoracle.kvcache.pool.cupy_pool import _CupyArray

ROW_BYTES: Final = 4096  # the kernel's row: 128 threads of two 16-byte words (and K = 8 outputs)
_THREADS: Final = 128
_BLOCKS_PER_SM: Final = 32  # grid size: enough blocks in flight to keep HBM busy

_SOURCE: Final = r"""
extern "C" __global__ void fingerprint_halves(
        const int4* __restrict__ x, const int* __restrict__ weights, const long long* __restrict__ u,
        long long* __restrict__ halves, long long blocks, int rows) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const unsigned all = 0xffffffffu;
    int w[8][8];  // this thread's 32 bytes of each weight column, four to an int
    #pragma unroll
    for (int q = 0; q < 4; q++) {
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            w[q][k] = weights[k * 1024 + t * 4 + q];
            w[4 + q][k] = weights[k * 1024 + (128 + t) * 4 + q];
        }
    }
    __shared__ long long part[4][2];
    for (long long block = blockIdx.x; block < blocks; block += gridDim.x) {
        // Each warp folds its quarter of every row into A and B on its own (A and B are
        // linear in P, and a quarter's P is smaller than a row's): no barrier per row.
        long long a_sum = 0, b_sum = 0;  // lanes l with l % 4 == 0 hold k = l >> 2
        for (int r = 0; r < rows; r++) {
            const long long base = (block * rows + r) * 256;
            const int4 lo = x[base + t], hi = x[base + 128 + t];
            int acc[8];
            #pragma unroll
            for (int k = 0; k < 8; k++) {
                int s = __dp4a(lo.x, w[0][k], 0);
                s = __dp4a(lo.y, w[1][k], s);
                s = __dp4a(lo.z, w[2][k], s);
                s = __dp4a(lo.w, w[3][k], s);
                s = __dp4a(hi.x, w[4][k], s);
                s = __dp4a(hi.y, w[5][k], s);
                s = __dp4a(hi.z, w[6][k], s);
                acc[k] = __dp4a(hi.w, w[7][k], s);
            }
            // Butterfly: each exchange hands over the half of the sums the partner keeps,
            // so lane l ends with the warp's total for k = l >> 2.
            const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
            int h[4], g[2];
            #pragma unroll
            for (int j = 0; j < 4; j++)
                h[j] = (b4 ? acc[4 + j] : acc[j]) + __shfl_xor_sync(all, b4 ? acc[j] : acc[4 + j], 16);
            #pragma unroll
            for (int j = 0; j < 2; j++)
                g[j] = (b3 ? h[2 + j] : h[j]) + __shfl_xor_sync(all, b3 ? h[j] : h[2 + j], 8);
            int v = (b2 ? g[1] : g[0]) + __shfl_xor_sync(all, b2 ? g[0] : g[1], 4);
            v += __shfl_xor_sync(all, v, 2);
            v += __shfl_xor_sync(all, v, 1);
            if ((lane & 3) == 0) {
                const int term = (r * 8 + (lane >> 2)) * 2;
                a_sum += (long long)v * u[term];
                b_sum += (long long)v * u[term + 1];
            }
        }
        #pragma unroll
        for (int off = 4; off < 32; off <<= 1) {  // the eight k of the warp (other lanes hold 0)
            a_sum += __shfl_xor_sync(all, a_sum, off);
            b_sum += __shfl_xor_sync(all, b_sum, off);
        }
        if (lane == 0) {
            part[warp][0] = a_sum;
            part[warp][1] = b_sum;
        }
        __syncthreads();
        if (t < 2)
            halves[block * 2 + t] = (part[0][t] + part[1][t] + part[2][t] + part[3][t]) & 0xffffffffLL;
        __syncthreads();
    }
}
"""

_TRUSTED: dict[tuple[int, int], bool] = {}  # (device index, block bytes): the kernel agreed


class Dp4aFingerprint:
    """(A mod 2**32, B mod 2**32) of contiguous int8 blocks of a multiple of 4,096 bytes."""

    def __init__(self, cp: ModuleType, scheme: _Scheme, device_index: int) -> None:
        if scheme.row != ROW_BYTES:
            raise ValueError(f"the kernel reads rows of {ROW_BYTES} bytes, not {scheme.row}")
        self._cp, self._rows = cp, scheme.rows
        self._kernel = cp.RawKernel(_SOURCE, "fingerprint_halves")
        self._weights = cp.asarray(np.ascontiguousarray(scheme.w8.T).view(np.int32))  # [K, 1024]
        self._u = cp.asarray(np.ascontiguousarray(scheme.u))  # [R * K, 2]
        sms = int(cp.cuda.runtime.getDeviceProperties(device_index)["multiProcessorCount"])
        self._grid = _BLOCKS_PER_SM * sms

    def __call__(self, x8: _CupyArray) -> _CupyArray:
        cp, n = self._cp, x8.shape[0]
        x8 = cp.ascontiguousarray(x8)  # the kernel reads rows at fixed strides
        halves: _CupyArray = cp.empty((n, 2), dtype=cp.int64)
        if n:
            self._kernel((min(n, self._grid),), (_THREADS,),
                         (x8, self._weights, self._u, halves, cp.int64(n), cp.int32(self._rows)))
        return halves

    @classmethod
    def load(cls, cp: ModuleType, scheme: _Scheme, device_index: int) -> Dp4aFingerprint | None:
        """The kernel for the current device, if it builds and agrees with the definition
        on random blocks (checked once per device and block size); else None."""
        if scheme.row != ROW_BYTES:
            return None
        key = (device_index, scheme.rows * scheme.row)
        try:
            kernel = cls(cp, scheme, device_index)
            if key not in _TRUSTED:
                blocks = np.random.default_rng(key[1]).integers(-128, 128, size=(37, key[1]), dtype=np.int8)
                got = kernel(cp.asarray(blocks)).get()
                _TRUSTED[key] = bool(np.array_equal(got, _np_halves(blocks, scheme)))
                if not _TRUSTED[key]:
                    warnings.warn("the cupy fingerprint kernel disagrees with the definition here; "
                                  "using float32 GEMMs", RuntimeWarning, stacklevel=2)
        except (cp.cuda.compiler.CompileException, cp.cuda.driver.CUDADriverError) as exc:
            warnings.warn(f"the cupy fingerprint kernel did not build ({exc}); using float32 GEMMs",
                          RuntimeWarning, stacklevel=2)
            return None
        return kernel if _TRUSTED[key] else None
