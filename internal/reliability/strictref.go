package reliability

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// StrictJSON is an independent reference for the strict JSON rules of
// CONTRACT [JSON-1], for differential fuzzing of the host's own readers
// (internal/strictjson and everything built on it). It is written on
// encoding/json, which the host does not use for reading, and returns the one
// value of data (objects as map[string]any, numbers as json.Number), or why
// data breaks a rule: a byte-order mark, invalid UTF-8, anything but exactly
// one value with only JSON whitespace around it, a duplicate object key,
// nesting deeper than maxDepth, an unpaired surrogate escape, or anything
// encoding/json itself refuses (unescaped control characters, NaN, ...).
// Shapes and schemas are the caller's business.
func StrictJSON(data []byte, maxDepth int) (any, error) {
	if bytes.HasPrefix(data, []byte("\ufeff")) {
		return nil, errors.New("byte-order mark")
	}
	if !utf8.Valid(data) {
		return nil, errors.New("invalid utf-8")
	}
	if !json.Valid(data) {
		return nil, errors.New("not exactly one json value")
	}
	if err := checkTokens(data, maxDepth); err != nil {
		return nil, err
	}
	if err := checkSurrogates(data); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// frame is one open object or array while walking tokens.
type frame struct {
	object  bool
	wantKey bool
	keys    map[string]bool
}

// checkTokens walks the tokens of a valid document: no duplicate key in any
// object, nesting at most maxDepth.
func checkTokens(data []byte, maxDepth int) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				valueDone(stack)
				continue
			}
			k := tok.(string)
			if top.keys[k] {
				return fmt.Errorf("duplicate key %q", k)
			}
			top.keys[k] = true
			top.wantKey = false
			continue
		}
		switch d, _ := tok.(json.Delim); d {
		case '{', '[':
			if len(stack) == maxDepth {
				return fmt.Errorf("nesting deeper than %d", maxDepth)
			}
			stack = append(stack, &frame{object: d == '{', wantKey: d == '{', keys: map[string]bool{}})
		case ']', '}':
			stack = stack[:len(stack)-1]
			valueDone(stack)
		default:
			valueDone(stack)
		}
	}
}

// valueDone records that a value of the innermost open object ended.
func valueDone(stack []*frame) {
	if len(stack) > 0 && stack[len(stack)-1].object {
		stack[len(stack)-1].wantKey = true
	}
}

// checkSurrogates refuses a \u escape of a high surrogate not followed by
// one of a low surrogate, and a low surrogate escape not preceded by a high
// one. data is a valid document, so strings are well delimited.
func checkSurrogates(data []byte) error {
	in, high := false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !in {
			in = c == '"'
			continue
		}
		if c != '\\' {
			if high {
				return errors.New("unpaired high surrogate")
			}
			in = c != '"'
			continue
		}
		i++
		if data[i] != 'u' {
			if high {
				return errors.New("unpaired high surrogate")
			}
			continue
		}
		var u rune
		fmt.Sscanf(string(data[i+1:i+5]), "%04x", &u)
		i += 4
		switch {
		case u >= 0xD800 && u <= 0xDBFF:
			if high {
				return errors.New("unpaired high surrogate")
			}
			high = true
		case u >= 0xDC00 && u <= 0xDFFF:
			if !high {
				return errors.New("unpaired low surrogate")
			}
			high = false
		default:
			if high {
				return errors.New("unpaired high surrogate")
			}
		}
	}
	return nil
}
