package handler

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
)

// statusOK is the body of /healthz and of a ready /readyz, the
// encoding of gin.H{"status": "ok"}, which they sent before.
const statusOK = `{"status":"ok"}`

func handleHealthz() gin.HandlerFunc {
	body := []byte(statusOK)
	return func(c *gin.Context) {
		writeJSON(c, http.StatusOK, body)
	}
}

// handleReadyz answers 200 when ready names no dependency, else 503 naming
// those it does (why they fail is in the log, where the probes write it).
// Once stopping says so it answers 503 whatever ready says, so that a
// balancer takes the replica out of service before it stops. It does no
// I/O: the answer is as cheap under a flood of /readyz as /healthz's.
func handleReadyz(ready func() []string, stopping func() bool) gin.HandlerFunc {
	body := []byte(statusOK)
	return func(c *gin.Context) {
		if stopping != nil && stopping() {
			writeError(c, errStopping)
			return
		}
		if ready != nil {
			if failing := ready(); len(failing) > 0 {
				writeError(c, fmt.Errorf("%w: %s", errUnavailable, strings.Join(failing, ", ")))
				return
			}
		}
		writeJSON(c, http.StatusOK, body)
	}
}
