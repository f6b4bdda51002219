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
// [XFER-6].

// extensionPackTransfer is `fm extension pack-transfer`.
func extensionPackTransfer(e *Env, args []string) error {
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
}

// extensionReceiveTransferBind is `fm extension receive-transfer-bind`.
func extensionReceiveTransferBind(e *Env, rf *bindFlags, args []string) error {
	if err := need(args, 0, 0, "no positional arguments (the envelope is read from stdin)"); err != nil {
		return err
	}
	h, opts, err := e.bindOptions(rf, "")
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
}

// remoteBindFlags are bind's flags and the deadline of the remote job.
type remoteBindFlags struct {
	bindFlags
	timeout string
}

func (f *remoteBindFlags) declare(fs *flag.FlagSet) {
	f.bindFlags.declare(fs)
	fs.StringVar(&f.timeout, "timeout", "", "deadline of the whole remote job: 90s, 15m or milliseconds, 0 for none (default 10m); not the binding's --timeout-ms")
}

// extensionRemoteBind is `fm extension remote-bind`.
func extensionRemoteBind(e *Env, f *remoteBindFlags, args []string) error {
	if err := need(args, 2, 2, "a secondmate id and one package directory"); err != nil {
		return err
	}
	if _, err := f.options(args[1]); err != nil {
		return err
	}
	var timeout *time.Duration
	if f.timeout != "" {
		d, err := remote.ParseTimeout(f.timeout)
		if err != nil {
			return err
		}
		timeout = &d
	}
	h, r, err := e.route(args[0])
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
	job := append([]string{"extension", "receive-transfer-bind"}, f.args()...)
	return runOn(e, r, job, data, jobTimeout(timeout), func(stdout []byte) error {
		return remote.CheckBound(r, stdout, p)
	})
}

// retireTransferFlags are the two digests retire-transfer requires.
type retireTransferFlags struct{ transferDigest, bindingDigest string }

func (f *retireTransferFlags) declare(fs *flag.FlagSet) {
	fs.StringVar(&f.transferDigest, "if-transfer-digest", "", "the transfer digest printed by receive-transfer-bind (required)")
	fs.StringVar(&f.bindingDigest, "if-binding-digest", "", "the binding digest printed by receive-transfer-bind (required)")
}

// extensionRetireTransfer is `fm extension retire-transfer`.
func extensionRetireTransfer(e *Env, f *retireTransferFlags, args []string) error {
	if err := need(args, 1, 1, "one extension id"); err != nil {
		return err
	}
	if f.transferDigest == "" || f.bindingDigest == "" {
		return errcode.New(errcode.Usage, "--if-transfer-digest and --if-binding-digest are both required")
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	res, err := transfer.Retire(e.Ctx, h, args[0], f.transferDigest, f.bindingDigest)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "retired-transfer: %s@%s %s\n", res.ID, res.Version, res.TransferDigest)
	fmt.Fprintf(e.Stdout, "retired-binding: %s %s\n", res.ID, res.BindingDigest)
	fmt.Fprintf(e.Stdout, "retained-at: %s\n", res.At)
	return nil
}
