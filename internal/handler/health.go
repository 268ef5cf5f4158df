package handler

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/gin-gonic/gin"
)

// readyTimeout bounds each readiness check.
const readyTimeout = time.Second

func handleHealthz() gin.HandlerFunc {
	return func(c *gin.Context) {
		c.JSON(http.StatusOK, gin.H{"status": "ok"})
	}
}

// handleReadyz answers 200 when every check passes, else 503 naming the
// dependencies that failed (not why: that goes to the log). Once stopping
// says so it answers 503 without checking, so that a balancer takes the
// replica out of service before it stops.
func handleReadyz(checks map[string]Check, stopping func() bool) gin.HandlerFunc {
	names := make([]string, 0, len(checks))
	for name := range checks {
		names = append(names, name)
	}
	sort.Strings(names)
	return func(c *gin.Context) {
		if stopping != nil && stopping() {
			writeError(c, errStopping)
			return
		}
		var failed []string
		for _, name := range names {
			ctx, cancel := context.WithTimeout(c.Request.Context(), readyTimeout)
			err := checks[name](ctx)
			cancel()
			if err != nil {
				_ = c.Error(fmt.Errorf("%s: %w", name, err))
				failed = append(failed, name)
			}
		}
		if len(failed) > 0 {
			writeError(c, fmt.Errorf("%w: %v", errUnavailable, failed))
			return
		}
		c.JSON(http.StatusOK, gin.H{"status": "ok"})
	}
}
