#!/bin/sh
# The figures the 2-vCPU development machine cannot give, in one bounded
# run on a bigger host, a GPU one where there is one: the coordinator's
# commit latency at 8,192 ranks (plaintext and mutual TLS, alternating),
# Save against memcpy on many cores, the Python SDK's CUDA, FSDP2-over-NCCL
# and DCP tests on the host's torch, and dcp.save from GPU state against
# FileSystemWriter.
#
#   make host-pack                       # here: static binaries, gzipped, in bin/host/
#   sh internal/bench/hostcheck.sh OUT   # there, in the repository root
#
# The host needs no Go: the binaries come from bin/host/. It needs
# python3 with torch (2.x for DCP), grpcio, protobuf, numpy, xxhash and
# pytest for the Python parts, which are skipped without them. Each part
# has a time limit; everything it prints goes to OUT/hostcheck.log, the
# host's description to OUT/host.txt. HOSTCHECK_PARTS picks parts
# (default: coord save python dcp; suite, the rest of the Python suite
# on the host's torch, runs only when named: it takes longer than the
# others together).
set -u
out=${1:?usage: hostcheck.sh OUTDIR}
mkdir -p "$out"
log=$out/hostcheck.log
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
for b in rewind rewind-dev gowriter; do
	gzip -dc "bin/host/$b.gz" >"$bin/$b" || { echo "hostcheck: no bin/host/$b.gz: run make host-pack first" >&2; exit 2; }
	chmod +x "$bin/$b"
done
py=${PYTHON:-python3}
{
	echo "cores: $(nproc)"; uptime; uname -srm
	grep -m1 'model name' /proc/cpuinfo
	free -g | head -2; df -h /dev/shm /var/tmp
	command -v nvidia-smi >/dev/null && nvidia-smi -L
	$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1
} >"$out/host.txt" 2>&1
cat "$out/host.txt"

# part NAME SECONDS COMMAND...: runs COMMAND under a time limit, appends
# its output to the log and prints its end.
part() {
	name=$1 limit=$2
	shift 2
	echo "== $name (limit ${limit}s, load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$log"
	start=$(date +%s)
	timeout "$limit" "$@" >"$out/part.txt" 2>&1
	rc=$?
	cat "$out/part.txt" >>"$log"
	echo "== $name: exit $rc after $(($(date +%s) - start))s" | tee -a "$log"
	tail -n 15 "$out/part.txt"
	rm -f "$out/part.txt"
}
has() { case " ${HOSTCHECK_PARTS:-coord save python dcp} " in *" $1 "*) return 0 ;; esac; return 1; }

if has coord; then
	for i in 1 2 3; do
		part "coordinator, plaintext, run $i" 60 "$bin/rewind-dev" bench coordinator --ranks 8192 --steps 200
		part "coordinator, mutual TLS, run $i" 60 "$bin/rewind-dev" bench coordinator --ranks 8192 --steps 200 --tls
	done
fi
if has save; then
	part "save against memcpy" 240 "$bin/rewind-dev" bench save --sizes 1GiB,4GiB --runs 3
fi
if has python && $py -c 'import torch, grpc, numpy, google.protobuf, pytest, xxhash' 2>/dev/null; then
	part "python SDK: CUDA, FSDP2 and DCP tests" 300 \
		env REWIND_BIN="$bin/rewind" REWIND_GOWRITER="$bin/gowriter" PYTHONUNBUFFERED=1 \
		$py -m pytest -v -p no:cacheprovider -rs -o faulthandler_timeout=120 \
		sdk/python/tests/test_cuda.py sdk/python/tests/test_dcp.py sdk/python/tests/test_dcp_stage.py
fi
if has suite && $py -c 'import torch, grpc, numpy, google.protobuf, pytest, xxhash' 2>/dev/null; then
	part "python SDK: the rest of the suite" 540 \
		env REWIND_BIN="$bin/rewind" REWIND_GOWRITER="$bin/gowriter" PYTHONUNBUFFERED=1 \
		$py -m pytest -q -p no:cacheprovider -rs -o faulthandler_timeout=120 \
		--ignore=sdk/python/tests/test_cuda.py --ignore=sdk/python/tests/test_dcp.py \
		--ignore=sdk/python/tests/test_dcp_stage.py sdk/python/tests
fi
if has dcp && $py -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	part "dcp.save from GPU state" 300 env PYTHONUNBUFFERED=1 USE_LIBUV=0 \
		$py sdk/python/bench_dcp.py --rewind-bin "$bin/rewind" --device cuda --world 1 --mib 4096 --runs 5
fi
