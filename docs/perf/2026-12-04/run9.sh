#!/usr/bin/env bash
# Run 9: run 8 again on test binaries rebuilt after the merge (run 8's test_gpu, test_bwd_gpu and test_vendored were
# stale: `make` does not rebuild the test programs, so its C tests ran main 8569574's, its Python tests this
# build's libmoegen.so), plus what the machine's C++ compiler links (run 8: /opt/gcc/bin/g++ adds
# -static-libstdc++, so build_cxx refused the torch op and the JAX handler).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
{ v test_gpu_variants 300 build/tests/test_gpu variants.tune
  v test_bwd_variants 120 build/tests/test_bwd_gpu train_softmax
  v test_vendored 120 build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe; } &
v test_gpu_examples 420 build/tests/test_gpu = examples/ &
{ v test_runtime 200 build/tests/test_runtime; v test_ep_gpu 200 build/tests/test_ep_gpu; } &
{
  set -x
  type -a g++ gcc c++ cc; head -c 1500 /opt/gcc/bin/g++; echo; file -L /opt/gcc/bin/g++
  /opt/gcc/bin/g++ --version | head -1; /usr/bin/g++ --version 2>&1 | head -1
  ls -la /opt/gcc/lib64 2>&1 | grep -i stdc; ls -la /usr/lib/x86_64-linux-gnu/ | grep -i stdc
  python3 -c 'import torch; print(open("/proc/self/maps").read())' | grep -o '/[^ ]*stdc++[^ ]*' | sort -u
  strings /usr/lib/x86_64-linux-gnu/libstdc++.so.6 | grep -E '^GLIBCXX_3\.4\.[0-9]+$' | sort -V | tail -2
  echo 'int f(long x){ return (int)std::to_string(x).size(); }' | sed '1i #include <string>' > /tmp/t.cc
  for flags in "" "-nostdlib++ -Wl,-Bdynamic -lstdc++" "-nostdlib++ -l:libstdc++.so.6"; do
      /opt/gcc/bin/g++ -shared -fPIC /tmp/t.cc $flags -o /tmp/t.so && readelf -d /tmp/t.so | grep NEEDED | tr -d '\n'; echo " <- $flags"
      python3 -c 'import torch, ctypes; ctypes.CDLL("/tmp/t.so"); print("loads beside torch")'
  done
  /opt/gcc/bin/g++ -shared -fPIC /tmp/t.cc -v -o /tmp/t.so 2>&1 | tail -3
} > "$OUT/cxx.log" 2>&1
wait
cat "$OUT/rc.txt"
for f in "$OUT"/test*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+): [0-9]+ passed' $f | tail -1)"; done
grep -hE 'FAIL' "$OUT"/test*.log | head -30
