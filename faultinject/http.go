package faultinject

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// HandlerPath is where Handler is mounted on a daemon's metrics address.
const HandlerPath = "/debug/faults"

// State is what GET /debug/faults answers.
type State struct {
	Points []PointState `json:"points"`
}

// PointState is one point of the table with its armed term and hits.
type PointState struct {
	Name  string `json:"name"`
	Where string `json:"where"`
	Kinds []Kind `json:"kinds"`
	Armed string `json:"armed,omitempty"`
	Hits  uint64 `json:"hits"`
}

// Handler serves the injector's admin endpoint:
//
//	GET    /debug/faults   the table, what is armed, how often each point fired (JSON)
//	PUT    /debug/faults   arm the spec in the body (point=term;...); a bad spec is 400 and arms nothing
//	DELETE /debug/faults   disarm everything
func (in *Injector) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(in.State())
		case http.MethodPut, http.MethodPost:
			body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if err := in.Set(string(body)); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprintln(w, "armed")
		case http.MethodDelete:
			in.Clear()
			fmt.Fprintln(w, "cleared")
		default:
			w.Header().Set("Allow", "GET, PUT, DELETE")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
}

// State returns the table with what is armed and how often each point
// fired.
func (in *Injector) State() State {
	var st State
	var hits map[string]uint64
	armed := map[string]string{}
	if in != nil {
		in.mu.Lock()
		for k, v := range in.specs {
			armed[k] = v
		}
		in.mu.Unlock()
		hits = in.Hits()
	}
	for _, p := range Points {
		st.Points = append(st.Points, PointState{Name: p.Name, Where: p.Where, Kinds: p.Kinds, Armed: armed[p.Name], Hits: hits[p.Name]})
	}
	return st
}
