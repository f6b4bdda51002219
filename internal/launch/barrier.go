package launch

import "firstmate.dev/fm/internal/launch/barrier"

// BarrierArg is the hidden argv[1] that makes fm (or a test binary) act as the
// launch barrier [GRP-1]; the barrier itself is package barrier, which every
// program importing launch runs from its init.
const BarrierArg = barrier.Arg

// EntrypointUmask is the umask every entrypoint starts with (barrier.EntrypointUmask).
const EntrypointUmask = barrier.EntrypointUmask

// MaybeBarrier runs the launch barrier when os.Args[1] asks for it and never
// returns then; otherwise it returns at once. Package barrier's init already
// calls it, so a program that imports launch is the barrier before any of
// its own packages is initialised; main() and TestMain call it as well,
// first, to say so.
func MaybeBarrier() { barrier.Maybe() }
