package store

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/space-sandbox/space"
)

// Classify turns a Postgres outage into EUNAVAILABLE (503) and leaves every other
// error, domain errors included, as it is: what the request paths return after a
// query.
func Classify(err error) error {
	if err == nil || space.ErrorCode(err) != space.EINTERNAL {
		return err
	}
	if Unreachable(err) {
		return space.Unavailable("postgres", err)
	}
	return err
}

// Unreachable reports whether err means Postgres could not be reached or went away
// (a dial failure, a broken connection, a timeout, a server shutting down), as opposed
// to Postgres answering with an error about the query. The first is an outage (503);
// the second is a bug (500).
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) >= 2 && pgErr.Code[:2] == "08": // connection exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // shutdown, crash, cannot connect now
			return true
		case pgErr.Code == "53300": // too many connections
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr), errors.As(err, &netErr):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, context.DeadlineExceeded):
		return true
	case pgconn.Timeout(err):
		return true
	}
	// pgx reports a connection lost mid-query and a closed pool in plain errors.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "closed pool") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe")
}
