package console

import (
	"encoding/json"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/execution"
	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
)

// timeFormat is how the console shows a time: UTC to the millisecond, as the logs do.
const timeFormat = "2006-01-02 15:04:05.000Z"

var funcs = template.FuncMap{
	"ts": func(t *timestamppb.Timestamp) string {
		if t == nil {
			return ""
		}
		return t.AsTime().UTC().Format(timeFormat)
	},
	"time": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(timeFormat)
	},
	"dur": func(d *durationpb.Duration) string {
		if d == nil {
			return ""
		}
		return server.DurationText(d.AsDuration())
	},
	"offset": func(d time.Duration) string { return "+" + d.Round(time.Millisecond).String() },
	// at is the class that places an element on the time axis, to the nearest percent: a
	// class, not a style attribute, so that the Content-Security-Policy needs no inline styles.
	"at":          func(pct float64) string { return "p" + strconv.Itoa(int(math.Round(max(0, min(100, pct))))) },
	"status":      func(s executionv1.ExecutionStatus) string { return string(execution.StatusFromProto(s)) },
	"eventStatus": eventStatusName,
	"kind":        kindName,
	"progress": func(p *structpb.Struct) string {
		if p == nil {
			return ""
		}
		raw, err := json.Marshal(p.AsMap())
		if err != nil {
			return ""
		}
		return string(raw)
	},
	"detail": func(raw []byte) string { return string(raw) },
	"list":   func(s ...string) []string { return s },
}

func eventStatusName(s eventsv1.EventStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "EVENT_STATUS_"))
}

// kindName is a timeline entry's kind as the page shows it: "attempt started".
func kindName(k gatewayv1.TimelineEntryKind) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k.String(), "TIMELINE_ENTRY_KIND_")), "_", " ")
}
