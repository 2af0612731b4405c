#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler, kube-controller-manager and etcd from their Go modules (go.mod
# beside this script pins them) into a cache outside the work tree, and prints that folder. A build is
# reused while go.mod, go.sum and this script are unchanged; each binary is installed only once whole.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$here/go.mod")"
version="${version#v}"
minor="$(echo "$version" | cut -d. -f2)"
stamp="$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)"
out="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/controlplane/v$version-$stamp"
mkdir -p "$out"

command -v go >/dev/null || { echo "build.sh: the Go toolchain (go) is not on PATH" >&2; exit 2; }
version_flags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_flags+=" -X $pkg.gitVersion=v$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  version_flags+=" -X $pkg.gitTreeState=clean"
done

build() {  # name, package
  [ -x "$out/$1" ] && return 0
  echo "building $1 (v$version) ..." >&2
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w$version_flags" -o "$out/.$1.tmp" "$2")
  mv "$out/.$1.tmp" "$out/$1"
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
echo "$out"
