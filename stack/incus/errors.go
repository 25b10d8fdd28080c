package incus

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"
)

// StatusError is an error response from incusd. Code is the Incus error code,
// which is the HTTP status (404, 409, 412, ...). Message is Incus's own text,
// unchanged.
type StatusError struct {
	Method  string
	Path    string
	Code    int
	Message string
}

func (e *StatusError) Error() string {
	msg := lowerFirst(e.Message)
	if msg == "" {
		msg = strings.ToLower(http.StatusText(e.Code))
	}
	return fmt.Sprintf("incus: %s %s: %s (%d)", e.Method, e.Path, msg, e.Code)
}

// OperationError is an operation that ended in Failure (Code 400) or
// Cancelled (Code 401). Message is the operation's "err".
type OperationError struct {
	ID          string
	Description string
	Code        int
	Message     string
}

func (e *OperationError) Error() string {
	what := "operation " + e.ID
	if e.Description != "" {
		what += " (" + lowerFirst(e.Description) + ")"
	}
	if e.Code == operationCancelled {
		return fmt.Sprintf("incus: %s was cancelled: %s", what, lowerFirst(e.Message))
	}
	return fmt.Sprintf("incus: %s failed: %s", what, lowerFirst(e.Message))
}

// UnreachableError means nothing answered on the socket: incusd is not
// running, the path is wrong, or this user may not open it.
type UnreachableError struct {
	Socket string
	Err    error
}

func (e *UnreachableError) Error() string {
	hint := "check that incusd is running (systemctl status incus), or set INCUS_SOCKET to the socket it listens on"
	if strings.HasPrefix(e.Socket, "https://") {
		hint = "check the address, and that the server listens there (incus config get core.https_address on it)"
	} else if errors.Is(e.Err, os.ErrPermission) || errors.Is(e.Err, syscall.EACCES) {
		hint = "this user may not open the socket: join the incus-admin group (or incus, and use unix.socket.user), then log in again"
	}
	return fmt.Sprintf("incus: cannot reach incusd at %s: %v; %s", e.Socket, unwrapOpError(e.Err), hint)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// unwrapOpError drops net.OpError's "dial unix /path:" prefix, which repeats
// the socket we already name.
func unwrapOpError(err error) error {
	var sys *os.SyscallError
	if errors.As(err, &sys) {
		return sys
	}
	return err
}

// MalformedError is a response that is not what the Incus API promises: not
// JSON, no envelope, or metadata of the wrong shape. It usually means the
// socket is not incusd's.
type MalformedError struct {
	Method string
	Path   string
	Err    error
	Body   string // a short prefix of what came back
}

func (e *MalformedError) Error() string {
	s := fmt.Sprintf("incus: %s %s: malformed response: %v", e.Method, e.Path, e.Err)
	if e.Body != "" {
		s += fmt.Sprintf(" (body %q)", e.Body)
	}
	return s
}

func (e *MalformedError) Unwrap() error { return e.Err }

// statusCode is the Incus error code in err's chain, or 0.
func statusCode(err error) int {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

// IsNotFound reports whether incusd answered 404: the object (or the
// project it was looked up in) does not exist.
func IsNotFound(err error) bool { return statusCode(err) == http.StatusNotFound }

// IsConflict reports whether incusd answered 409 Conflict, and nothing else.
// Incus is not consistent about "already exists": a network or image alias
// gives 409, but an existing network ACL gives 400, an existing profile 500,
// and an existing instance or image fails inside the operation. Use
// IsAlreadyExists for that question, or look the object up first.
func IsConflict(err error) bool { return statusCode(err) == http.StatusConflict }

// IsPreconditionFailed reports whether a PUT was refused because the ETag
// sent as If-Match is stale (412): re-read the object and try again.
func IsPreconditionFailed(err error) bool {
	return statusCode(err) == http.StatusPreconditionFailed
}

// IsUnreachable reports whether incusd could not be reached on its socket.
func IsUnreachable(err error) bool {
	var ue *UnreachableError
	return errors.As(err, &ue)
}

// IsAlreadyExists reports whether a create failed because the object exists:
// a 409, or (because Incus gives no code for the other cases listed at
// IsConflict) a StatusError or OperationError whose message says "already
// exists" or, as incusd 6.0.4 does for a second instance of the same name,
// fails the database's "UNIQUE constraint". This is the only place the
// package matches on Incus's text.
func IsAlreadyExists(err error) bool {
	if IsConflict(err) {
		return true
	}
	var msg string
	var se *StatusError
	var oe *OperationError
	switch {
	case errors.As(err, &se):
		msg = se.Message
	case errors.As(err, &oe):
		msg = oe.Message
	default:
		return false
	}
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "already exists") || strings.Contains(msg, "unique constraint failed")
}

// lowerFirst lowercases Incus's capitalised messages for our error style,
// but leaves initialisms ("IPv4", "ACL") alone.
func lowerFirst(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 || !unicode.IsUpper(r) {
		return s
	}
	if r2, _ := utf8.DecodeRuneInString(s[n:]); unicode.IsUpper(r2) {
		return s
	}
	return string(unicode.ToLower(r)) + s[n:]
}
