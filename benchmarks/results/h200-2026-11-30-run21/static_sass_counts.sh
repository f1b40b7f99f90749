#!/bin/bash
# static_sass_counts.sh KERNEL_DIR: static SASS instruction counts of the bf16 norm kernels, with norm.cu reduced
# to the branch-free vector path of the backward kernels (FULL, not zero-centered). Needs nvcc and cuobjdump; on a
# machine without the CUDA toolkit's cuobjdump, the PyPI wheel nvidia-cuda-cuobjdump has one (nvidia/cu13/bin).
# Used on the CPU machine for make_variants.py's figures (nvcc 13.0, cuobjdump 13.5).
export PATH=${CUOBJDUMP_DIR:-/tmp/nvd/nvidia/cu13/bin}:$PATH
D=$(mktemp -d); cp $1/*.cu $1/*.cuh $D/
python3 - $D/norm.cu <<'PY'
import sys
p=sys.argv[1]; s=open(p).read()
old='''#define NORM_BWD_RUN(PASS)                  \\
  if (!full) {                              \\
    PASS(false, zero_centered)              \\
  } else if (KIND == L2 || !zero_centered) { \\
    PASS(true, false)                       \\
  } else {                                  \\
    PASS(true, true)                        \\
  }'''
assert old in s
s=s.replace(old,'#define NORM_BWD_RUN(PASS) PASS(true, false)')
s=s.replace('if (vec)','if (true)')
open(p,'w').write(s)
PY
nvcc -arch=sm_90 -cubin -std=c++17 --fmad=false --ftz=false --prec-div=true --prec-sqrt=true -o $D/n.cubin $D/norm.cu 2>/dev/null || echo COMPILE FAILED
for f in layer_norm_bwd_bf16 rms_norm_bwd_bf16 l2_norm_bwd_bf16 layer_norm_fwd_bf16 rms_norm_fwd_bf16; do
  echo "$f $(cuobjdump -sass -fun $f $D/n.cubin | grep -cE '^\s+/\*[0-9a-f]{4}\*/')"
done
