package adapter

import "firstmate.dev/fm/pkg/adapter/wire"

// The types a Handler sees are defined once, in package wire, which the host
// imports too; these names let an adapter import only this package. wire's
// documentation lists the rules they follow.
type (
	// PollInput is the input of source.poll: the source id and the
	// operator's config_ref.
	PollInput = wire.PollInput
	// ResultInput is the input of result.classify, result.terminal and
	// result.silent: one captured result of the source.
	ResultInput = wire.ResultInput
	// PollResult is the result of source.poll. Build it with Output or
	// NoResult.
	PollResult = wire.PollResult
	// ClassifyResult is the result of result.classify.
	ClassifyResult = wire.ClassifyResult
	// BoolResult is the result of result.terminal and result.silent.
	BoolResult = wire.BoolResult
	// ErrorBody is the error member of a failed response (see ErrorBodyOf).
	ErrorBody = wire.ErrorBody
	// Code is one of the five error codes a package may answer with. The
	// host reports a package failure as extension-<code>.
	Code = wire.Code
	// Error is a handler failure with a protocol code. Return one (directly
	// or wrapped, see Errorf) from a Handler method to choose the code and
	// retryability of the error response; any other error is answered as
	// internal, not retryable.
	Error = wire.Error
)

// The five protocol error codes (see wire.Code for when to use which).
const (
	InvalidRequest Code = wire.InvalidRequest
	Incompatible   Code = wire.Incompatible
	Conflict       Code = wire.Conflict
	Unavailable    Code = wire.Unavailable
	Internal       Code = wire.Internal
)

// Output returns the poll result carrying output.
func Output(output string) PollResult {
	return PollResult{Status: wire.StatusResult, Output: output}
}

// NoResult returns the poll result meaning "nothing happened before my wait
// ended". The host simply polls again with the same request id.
func NoResult() PollResult {
	return PollResult{Status: wire.StatusNoResult, Output: ""}
}
