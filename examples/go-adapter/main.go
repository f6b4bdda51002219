// Command firstmate-extension is the entrypoint of the dir-signal example
// package: a Firstmate process-event adapter built with the Go SDK
// (firstmate.dev/fm/pkg/adapter). Build it into bin/firstmate-extension of a
// package directory beside firstmate-extension.json; see README.md.
package main

import (
	"firstmate.dev/fm/examples/go-adapter/dirsignal"
	"firstmate.dev/fm/pkg/adapter"
)

func main() {
	adapter.Serve(dirsignal.New())
}
