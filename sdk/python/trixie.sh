#!/bin/sh
# A Debian trixie root for the PyTorch DCP tests: bookworm's torch (1.13)
# has no usable torch.distributed.checkpoint, DTensor or FSDP2; trixie's
# python3-torch (2.6) has them. python.mk calls it. With TRIXIE_SUITE=forky
# (and TRIXIE_TORCH_MIN=2.7) it makes a root of Debian's next release
# instead, whose torch (2.14) is the newest Debian has: the DCP tests run
# against the oldest torch 2.x rewind.dcp supports and the newest.
#
#   trixie.sh build ROOT            debootstrap + packages, once (a stamp file)
#   trixie.sh run ROOT REPO CMD...  CMD in the root, REPO at /src, /proc and
#                                   the host's /dev/shm mounted
#
# run mounts in a private mount namespace (unshare): every mount vanishes
# when CMD exits, however it exits (a SIGKILL included), nothing is left
# mounted on the host, and several runs may share the root at once. The
# host's /dev/shm is bound (not a fresh tmpfs) so that an agent started on
# either side of the chroot shares segments and sockets with the other.
set -eu

MIRROR=${TRIXIE_MIRROR:-http://deb.debian.org/debian}
SUITE=${TRIXIE_SUITE:-trixie}
# What the tests import. A minbase root from trixie's archive is what the
# suite pins; the build checks that its torch is of the major version the
# DCP interface needs (TRIXIE_TORCH_MAJOR), and at least TRIXIE_TORCH_MIN
# (major.minor) when given.
DEBS="python3-torch python3-numpy python3-grpcio python3-protobuf python3-pytest python3-xxhash"
TORCH_MAJOR=${TRIXIE_TORCH_MAJOR:-2}
TORCH_MIN=${TRIXIE_TORCH_MIN:-}
STAMP=.rewind-trixie-ready

die() { echo "trixie.sh: $*" >&2; exit 1; }

build() {
	root=$1
	[ -f "$root/$STAMP" ] && return 0
	command -v debootstrap >/dev/null || {
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
	}
	# A release this debootstrap predates is made as sid is (its script).
	script=/usr/share/debootstrap/scripts/$SUITE
	[ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
	[ -e "$script" ] || die "this debootstrap knows neither $SUITE nor sid"
	tmp="$root.partial"
	mkdir -p "$(dirname "$root")"
	# Each stage leaves a mark, so that a build cut short (a network
	# failure, an interrupt) goes on from the last stage done.
	if [ ! -f "$tmp/.debootstrapped" ]; then
		rm -rf "$tmp"
		debootstrap --variant=minbase "$SUITE" "$tmp" "$MIRROR" "$script" ||
			die "debootstrap failed (log: $tmp/debootstrap/debootstrap.log)"
		touch "$tmp/.debootstrapped"
	fi
	v=$(unshare --mount --propagation private -- sh -eu -c '
		mount -t proc proc "$1/proc"
		chroot "$1" sh -eu -c "
			export DEBIAN_FRONTEND=noninteractive
			apt-get -o Acquire::Check-Valid-Until=false update -qq
			apt-get -o Acquire::Check-Valid-Until=false install -y -qq --no-install-recommends $2
			apt-get clean
			rm -rf /var/lib/apt/lists/*
		" >&2
		chroot "$1" python3 -c "import torch, grpc, numpy, google.protobuf, pytest, xxhash; print(\"torch=\" + torch.__version__)"
		' sh "$tmp" "$DEBS") || die "installing $DEBS in the $SUITE root failed"
	v=$(echo "$v" | sed -n 's/^torch=//p')
	case "$v" in
	"$TORCH_MAJOR".*) ;;
	*) die "the $SUITE root has torch '$v', the DCP tests need torch $TORCH_MAJOR.x" ;;
	esac
	if [ -n "$TORCH_MIN" ]; then
		older=$(printf '%s\n%s\n' "$TORCH_MIN" "${v%%+*}" | sort -V | head -n1)
		[ "$older" = "$TORCH_MIN" ] || die "the $SUITE root has torch '$v', older than $TORCH_MIN"
	fi
	echo "trixie.sh: $SUITE root ready with torch $v"
	rm -rf "$root"
	mv "$tmp" "$root"
	touch "$root/$STAMP"
}

run() {
	root=$1 repo=$2
	shift 2
	[ -f "$root/$STAMP" ] || die "no root at $root: run trixie.sh build first"
	exec unshare --mount --propagation private -- sh -eu -c '
		root=$1 repo=$2
		shift 2
		mkdir -p "$root/src" "$root/dev/shm"
		mount -t proc proc "$root/proc"
		mount --bind /dev/shm "$root/dev/shm"
		mount --bind "$repo" "$root/src"
		exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
			USE_LIBUV=0 GLOO_SOCKET_IFNAME=lo "$@"' sh "$root" "$repo" "$@"
}

cmd=${1:-}
[ $# -ge 2 ] || die "usage: trixie.sh build ROOT | run ROOT REPO CMD..."
shift
case "$cmd" in
build)
	# One build at a time (make test builds the root in the background
	# while the front may ask for it): a second waits, then finds it ready.
	mkdir -p "$(dirname "$1")"
	exec 9>"$1.lock"
	flock 9
	build "$1"
	;;
run)
	[ $# -ge 3 ] || die "usage: trixie.sh run ROOT REPO CMD..."
	run "$@"
	;;
*) die "unknown command $cmd" ;;
esac
