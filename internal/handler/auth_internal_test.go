package handler

import (
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"shop/internal/stock"
)

// A buyer route that forgot authenticate fails loudly (500) instead of
// taking the body's user_id for the buyer, which with SHOP_AUTH=jwt would
// let anyone buy as anyone.
func TestBuyerNeedsAuthenticate(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequest("POST", "/api/v1/orders", nil)
	seven := int64(7)
	if _, err := buyer(c, &seven); !errors.Is(err, errInternal) {
		t.Errorf("buyer without authenticate: %v, want errInternal", err)
	}

	c.Set(buyerKey, int64(0)) // SHOP_AUTH=none
	if user, err := buyer(c, &seven); err != nil || user != 7 {
		t.Errorf("auth off, user_id 7: %d, %v", user, err)
	}
	if _, err := buyer(c, nil); !errors.Is(err, stock.ErrInvalid) {
		t.Errorf("auth off, no user_id: %v, want ErrInvalid", err)
	}

	c.Set(buyerKey, int64(8)) // SHOP_AUTH=jwt, sub 8
	if user, err := buyer(c, nil); err != nil || user != 8 {
		t.Errorf("sub 8, no user_id: %d, %v", user, err)
	}
	if _, err := buyer(c, &seven); !errors.Is(err, errForbidden) {
		t.Errorf("sub 8, user_id 7: %v, want errForbidden", err)
	}
}
