// Package safetext shortens and cleans text that came from outside (adapter messages, transport
// errors) before it is stored, logged or sent on: valid UTF-8 (protobuf and Postgres refuse
// anything else), no NUL bytes (Postgres text refuses them), bounded length, and no URLs from
// HTTP client errors (a webhook URL may carry a secret in its path or query).
package safetext

import (
	"errors"
	"net/url"
	"strings"
	"unicode/utf8"
)

// Truncate returns s as valid UTF-8 without NUL bytes, cut on a rune boundary to at most n bytes.
func Truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// Error renders err for storage, dropping the URL an *url.Error carries (keeping its operation
// and cause), then applies Truncate.
func Error(err error, n int) string {
	if err == nil {
		return ""
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return Truncate(uerr.Op+" request: "+errorWithoutURL(uerr), n)
	}
	return Truncate(err.Error(), n)
}

func errorWithoutURL(uerr *url.Error) string {
	msg := uerr.Err.Error()
	// Some causes repeat the URL (redirect errors); keep none of it.
	return strings.ReplaceAll(msg, uerr.URL, "<url>")
}
