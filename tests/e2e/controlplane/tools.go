//go:build tools

// Package controlplane pins the commands the end-to-end tests build: kube-apiserver, kube-scheduler,
// kube-controller-manager and etcd, each from its own Go module.
package controlplane

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
