//go:build tools

// Package tools names the upstream main package this module builds, so that
// `go mod tidy` keeps its dependencies in go.sum.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
