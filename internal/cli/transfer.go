package cli

import (
	"flag"
	"fmt"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/remote"
	"firstmate.dev/fm/internal/transfer"
)

// The transfer verbs of CONTRACT §12: pack-transfer [XFER-1],
// receive-transfer-bind [XFER-3], remote-bind [XFER-5] and retire-transfer
// [XFER-6]. Flag state is reset on every parse, so the verbs can run more
// than once in one process.
func init() {
	register("extension", &Verb{
		Name:    "pack-transfer",
		Args:    "<package-dir>",
		Summary: "write the package as one canonical transfer envelope to stdout (the rules of bind and the receiver's limits apply)",
		Run: func(e *Env, args []string) error {
			h, err := e.homeFor(args, 1, 1, "one package directory")
			if err != nil {
				return err
			}
			data, err := transfer.Pack(args[0], h.Dir)
			if err != nil {
				return err
			}
			_, err = e.Stdout.Write(data)
			return err
		},
	})

	var rf bindFlags
	register("extension", &Verb{
		Name:    "receive-transfer-bind",
		Args:    "--adapter <name> [--adapter <name>...] --trust-same-user-code [--consent <fact>...] [--timeout-ms <n>] < envelope",
		Summary: "validate a transfer envelope from stdin, stage it under data/extensions/staging, and bind the staged package",
		Flags:   func(fs *flag.FlagSet) { rf = bindFlags{}; rf.declare(fs) },
		Run: func(e *Env, args []string) error {
			if err := need(args, 0, 0, "no positional arguments (the envelope is read from stdin)"); err != nil {
				return err
			}
			opts, err := rf.options("")
			if err != nil {
				return err
			}
			h, err := e.Home()
			if err != nil {
				return err
			}
			defer e.withProgress(&opts.Progress)()
			res, err := transfer.Receive(e.Ctx, h, e.Stdin, opts)
			if err != nil {
				return err
			}
			printBound(e, res.Binding)
			fmt.Fprintf(e.Stdout, "transfer-digest: %s\n", res.TransferDigest)
			return nil
		},
	})

	var (
		bf            bindFlags
		remoteTimeout string
	)
	register("extension", &Verb{
		Name:    "remote-bind",
		Args:    "<secondmate-id> <package-dir> --adapter <name> [--adapter <name>...] --trust-same-user-code [--consent <fact>...] [--timeout-ms <n>] [--timeout <duration>]",
		Summary: "pack the package here and bind it in a secondmate home through fm on --stdin ... receive-transfer-bind; this home gets no binding",
		Flags: func(fs *flag.FlagSet) {
			bf, remoteTimeout = bindFlags{}, ""
			bf.declare(fs)
			fs.StringVar(&remoteTimeout, "timeout", "", "deadline of the whole remote job: 90s, 15m or milliseconds, 0 for none (default 10m); not the binding's --timeout-ms")
		},
		Run: func(e *Env, args []string) error {
			if err := need(args, 2, 2, "a secondmate id and one package directory"); err != nil {
				return err
			}
			if _, err := bf.options(args[1]); err != nil {
				return err
			}
			var timeout *time.Duration
			if remoteTimeout != "" {
				d, err := remote.ParseTimeout(remoteTimeout)
				if err != nil {
					return err
				}
				timeout = &d
			}
			h, err := e.Home()
			if err != nil {
				return err
			}
			r, err := remote.Lookup(h, args[0])
			if err != nil {
				return err
			}
			data, err := transfer.Pack(args[1], h.Dir)
			if err != nil {
				return err
			}
			p, err := transfer.Open(data)
			if err != nil {
				return err
			}
			job := append([]string{"extension", "receive-transfer-bind"}, bf.args()...)
			return runOn(e, r, job, data, jobTimeout(timeout), func(stdout []byte) error {
				return remote.CheckBound(r, stdout, p)
			})
		},
	})

	var transferDigest, bindingDigest string
	register("extension", &Verb{
		Name:    "retire-transfer",
		Args:    "<extension-id> --if-transfer-digest <sha256:hex> --if-binding-digest <sha256:hex>",
		Summary: "disable a transferred binding and retire its staged transfer into data/extensions/retired-staging (resumes an interrupted retirement)",
		Flags: func(fs *flag.FlagSet) {
			transferDigest, bindingDigest = "", ""
			fs.StringVar(&transferDigest, "if-transfer-digest", "", "the transfer digest printed by receive-transfer-bind (required)")
			fs.StringVar(&bindingDigest, "if-binding-digest", "", "the binding digest printed by receive-transfer-bind (required)")
		},
		Run: func(e *Env, args []string) error {
			if err := need(args, 1, 1, "one extension id"); err != nil {
				return err
			}
			if transferDigest == "" || bindingDigest == "" {
				return errcode.New(errcode.Usage, "--if-transfer-digest and --if-binding-digest are both required")
			}
			h, err := e.Home()
			if err != nil {
				return err
			}
			res, err := transfer.Retire(e.Ctx, h, args[0], transferDigest, bindingDigest)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "retired-transfer: %s@%s %s\n", res.ID, res.Version, res.TransferDigest)
			fmt.Fprintf(e.Stdout, "retired-binding: %s %s\n", res.ID, res.BindingDigest)
			fmt.Fprintf(e.Stdout, "retained-at: %s\n", res.At)
			return nil
		},
	})
}
