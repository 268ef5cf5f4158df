// Package dbagent answers HAProxy's agent-check for one node of a Galera
// cluster, so that HAProxy sends the service's connections only to a node
// that can take writes now.
//
// A TCP check, or a login, passes on a node that is up but must not be
// written to: a donor or a joiner of a state transfer, a node desynced by
// an operator, a node cut off from the others (a non-Primary component,
// which answers every statement with ERROR 1047). HAProxy 2.6 has no check
// that reads Galera's state, and its agent-check is the way to give it one:
// HAProxy connects to the agent's port, reads one line, and marks the
// server down or up by its first word.
package dbagent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// Synced is wsrep_local_state's value for a node that is a full member of
// the cluster, applying and taking writes.
const Synced = "4"

// checkTimeout bounds one check: HAProxy's own (timeout check) is longer,
// and a node that cannot answer within it is down for HAProxy's purpose.
const checkTimeout = time.Second

// Health is what a node said about itself.
type Health struct {
	Up     bool
	Reason string // why it is down; empty when up
}

// Line is the agent-check answer for h: "up ready" (up, and out of an
// operator's drain or maintenance) or "down" with the reason after '#',
// which HAProxy shows in its stats and logs.
func (h Health) Line() string {
	if h.Up {
		return "up ready\n"
	}
	return "down #" + strings.ReplaceAll(h.Reason, "\n", " ") + "\n"
}

// Check asks the node db talks to whether it may be written to: it must be
// Synced (wsrep_local_state 4), in the Primary component and ready
// (wsrep_ready ON). A node that does not answer, or is not a Galera node
// at all (no wsrep status), is down.
func Check(ctx context.Context, db *sql.DB) Health {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN "+
		"('wsrep_local_state', 'wsrep_local_state_comment', 'wsrep_cluster_status', 'wsrep_ready')")
	if err != nil {
		return Health{Reason: "no answer: " + short(err)}
	}
	defer rows.Close()
	status := map[string]string{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return Health{Reason: "no answer: " + short(err)}
		}
		status[strings.ToLower(name)] = value
	}
	if err := rows.Err(); err != nil {
		return Health{Reason: "no answer: " + short(err)}
	}
	return judge(status)
}

// judge reads a node's wsrep status.
func judge(status map[string]string) Health {
	state, ok := status["wsrep_local_state"]
	switch {
	case !ok:
		return Health{Reason: "not a Galera node (no wsrep_local_state)"}
	case status["wsrep_cluster_status"] != "Primary":
		return Health{Reason: "cluster status " + orNone(status["wsrep_cluster_status"])}
	case state != Synced:
		return Health{Reason: fmt.Sprintf("local state %s (%s)", state, orNone(status["wsrep_local_state_comment"]))}
	case status["wsrep_ready"] != "ON":
		return Health{Reason: "not ready (wsrep_ready " + orNone(status["wsrep_ready"]) + ")"}
	}
	return Health{Up: true}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// short is err's message on one line, cut to a length HAProxy shows whole.
func short(err error) string {
	s := strings.ReplaceAll(err.Error(), "\n", " ")
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// Serve answers every connection accepted on ln with a check of db's node,
// until ctx ends or ln fails; it closes ln and returns once every answer
// in flight is written. A connection's answer is a fresh check: HAProxy
// checks every agent-inter, and each check must see the node as it is.
func Serve(ctx context.Context, ln net.Listener, db *sql.DB) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("dbagent: accept: %w", err)
		}
		wg.Go(func() {
			defer conn.Close()
			line := Check(ctx, db).Line()
			conn.SetWriteDeadline(time.Now().Add(checkTimeout))
			conn.Write([]byte(line))
		})
	}
}
