package pgbackend

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// withOverrides returns cfg.DSN with cfg's TLS fields put in place of the DSN's own.
func withOverrides(cfg Config) (string, error) {
	set := map[string]string{}
	for k, v := range map[string]string{"sslmode": cfg.SSLMode, "sslrootcert": cfg.SSLRootCert, "sslcert": cfg.SSLCert, "sslkey": cfg.SSLKey} {
		if v != "" {
			set[k] = v
		}
	}
	switch cfg.SSLMode {
	case "", "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
	default:
		return "", fmt.Errorf("pgbackend: sslmode %q: want disable, allow, prefer, require, verify-ca or verify-full", cfg.SSLMode)
	}
	if len(set) == 0 {
		return cfg.DSN, nil
	}
	if isURL(cfg.DSN) {
		u, err := url.Parse(cfg.DSN)
		if err != nil {
			return "", fmt.Errorf("pgbackend: dsn %s is not a URL", Redact(cfg.DSN))
		}
		q := u.Query()
		for k, v := range set {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	dsn := cfg.DSN
	for k, v := range set {
		// libpq takes the last of repeated keywords.
		dsn += fmt.Sprintf(" %s='%s'", k, strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v))
	}
	return dsn, nil
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

var keywordPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// Redact returns dsn with its password (in the URL's user info or a password keyword)
// replaced, for logs and errors.
func Redact(dsn string) string {
	if isURL(dsn) {
		if u, err := url.Parse(dsn); err == nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			}
			q := u.Query()
			if q.Has("password") {
				q.Set("password", "xxxxx")
				u.RawQuery = q.Encode()
			}
			return u.String()
		}
		return "(a postgres:// URL that does not parse)"
	}
	return keywordPassword.ReplaceAllString(dsn, "${1}xxxxx")
}

// redactErr makes sure an error does not carry the password, whatever the driver put in.
func redactErr(err error, cfg Config) error {
	msg := err.Error()
	for _, pw := range []string{cfg.Password, passwordOf(cfg.DSN)} {
		if len(pw) >= 3 && strings.Contains(msg, pw) {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

func passwordOf(dsn string) string {
	if isURL(dsn) {
		if u, err := url.Parse(dsn); err == nil {
			if pw, ok := u.User.Password(); ok {
				return pw
			}
			return u.Query().Get("password")
		}
		return ""
	}
	if m := keywordPassword.FindStringSubmatch(dsn); m != nil {
		return strings.Trim(m[2], "'")
	}
	return ""
}
