package binding

import (
	"os"
	"path/filepath"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
)

// SettingsSchema is the schema of a binding's fm-owned settings file.
const SettingsSchema = "firstmate.fm-binding-settings.v1"

// Handshake bound, in milliseconds ([HINT-3]): the default is the
// protocol's 5000; an operator may set 100..600000 at bind or upgrade.
const (
	DefaultHandshakeTimeoutMS = protocol.HandshakeTimeout
	MinHandshakeTimeoutMS     = 100
	MaxHandshakeTimeoutMS     = 600000
)

// Settings are fm's own settings of one binding, kept beside the registry
// rather than in the record, whose keys are exactly [BND-1]'s: at
// data/extensions/settings/<id>/<binding-digest-hex>.json (0600), so they
// belong to that exact binding (a retired binding moved back finds its own
// again; another binding of the id has other settings or none). The file
// exists only when a setting differs from its default.
type Settings struct {
	Schema             string `json:"schema"`
	HandshakeTimeoutMS int64  `json:"handshake_timeout_ms"`
}

// settingsPath is where the settings of the binding digest of id are kept.
func settingsPath(h *home.Home, id, digest string) string {
	return filepath.Join(h.Extensions(), "settings", id, Hex(digest)+".json")
}

// ReadSettings returns the settings of the binding digest of id: the
// defaults when it has no settings file.
func ReadSettings(h *home.Home, id, digest string) (Settings, error) {
	s := Settings{Schema: SettingsSchema, HandshakeTimeoutMS: DefaultHandshakeTimeoutMS}
	p := settingsPath(h, id, digest)
	data, err := fsutil.ReadPrivateFile(p, MaxBytes)
	if os.IsNotExist(err) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	if err := strictjson.Decode(data, MaxBytes, "binding settings "+p, &s); err != nil {
		return s, err
	}
	if s.Schema != SettingsSchema || s.HandshakeTimeoutMS < MinHandshakeTimeoutMS || s.HandshakeTimeoutMS > MaxHandshakeTimeoutMS {
		return s, errcode.New(errcode.SchemaInvalid, "binding settings %s: schema must be %q and handshake_timeout_ms %d..%d", p, SettingsSchema, MinHandshakeTimeoutMS, MaxHandshakeTimeoutMS)
	}
	return s, nil
}

// WriteSettings stores s as the settings of the binding digest of id, or
// removes its file when s holds only defaults. Callers hold the lifecycle
// lock and write before they publish the binding.
func WriteSettings(h *home.Home, id, digest string, s Settings) error {
	p := settingsPath(h, id, digest)
	if _, err := os.Lstat(p); os.IsNotExist(err) && s.HandshakeTimeoutMS == DefaultHandshakeTimeoutMS {
		return nil // the defaults need no file, nor its directories
	}
	for _, d := range []string{filepath.Dir(filepath.Dir(p)), filepath.Dir(p)} {
		if err := home.EnsurePrivate(d, false); err != nil {
			return err
		}
	}
	dir, err := home.OpenPrivate(filepath.Dir(p), false)
	if err != nil {
		return err
	}
	defer dir.Close()
	if s.HandshakeTimeoutMS == DefaultHandshakeTimeoutMS {
		return fsutil.RemoveAt(dir, filepath.Base(p))
	}
	s.Schema = SettingsSchema
	data, err := strictjson.Canonical(s)
	if err != nil {
		return err
	}
	return fsutil.ReplaceAt(dir, filepath.Base(p), data)
}
