// Command gorender renders an Ollama TEMPLATE the way Ollama's server renders a chat prompt.
//
// It reads one JSON request {"template": "...", "data": {...}} from the file named as its first
// argument (or stdin) and writes the rendered prompt to stdout, byte for byte. A request
// {"batch": [request, ...]} instead prints a JSON array of {"output": "..."} or {"error": "..."}.
//
// "data" has the shape of an Ollama /api/chat request: messages (role, content, thinking,
// tool_calls, tool_name, tool_call_id), tools, think (bool or "low"/"medium"/"high"/"max"), plus
// "prompt"/"suffix" for a /api/generate fill-in-the-middle request and "now" (YYYY-MM-DD) to pin the
// date the date functions return. What the template sees follows Ollama's template package: system
// messages joined into .System, consecutive same-role messages merged, tool calls and tools in
// template-friendly types, the json/currentDate/yesterdayDate/toTypeScriptType functions, the legacy
// per-turn .Prompt/.Response rendering, and {{ .Response }} appended to templates that use neither
// .Messages nor .Response. Only the standard library is used.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
)

// ---------------------------------------------------------------- request shapes (Ollama's API JSON)

type request struct {
	Template string          `json:"template"`
	Data     chatRequest     `json:"data"`
	Batch    json.RawMessage `json:"batch"`
	// Analyze asks, instead of a rendering, for what Ollama reads out of the template itself.
	Analyze bool `json:"analyze"`
}

type chatRequest struct {
	Messages []apiMessage `json:"messages"`
	Tools    []apiTool    `json:"tools"`
	Think    interface{}  `json:"think"`
	Prompt   string       `json:"prompt"`
	Suffix   string       `json:"suffix"`
	Now      string       `json:"now"`
}

type apiMessage struct {
	Role       string        `json:"role"`
	Content    string        `json:"content"`
	Thinking   string        `json:"thinking"`
	Images     []string      `json:"images"`
	ToolCalls  []apiToolCall `json:"tool_calls"`
	ToolName   string        `json:"tool_name"`
	ToolCallID string        `json:"tool_call_id"`
}

type apiToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Index     int                    `json:"index"`
		Name      string                 `json:"name"`
		Arguments map[string]interface{} `json:"arguments"`
	} `json:"function"`
}

type apiTool struct {
	Type     string      `json:"type"`
	Items    interface{} `json:"items"`
	Function struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Parameters  struct {
			Type       string        `json:"type"`
			Defs       interface{}   `json:"$defs"`
			Items      interface{}   `json:"items"`
			Required   []string      `json:"required"`
			Properties *orderedProps `json:"properties"`
		} `json:"parameters"`
	} `json:"function"`
}

// ---------------------------------------------------------------- what templates see

// PropertyType is a JSON Schema "type": one name or a list of names.
type PropertyType []string

func (p *PropertyType) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*p = PropertyType{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*p = many
	return nil
}

func (p PropertyType) MarshalJSON() ([]byte, error) {
	if len(p) == 1 {
		return json.Marshal(p[0])
	}
	return json.Marshal([]string(p))
}

func (p PropertyType) String() string {
	switch len(p) {
	case 0:
		return ""
	case 1:
		return p[0]
	}
	return fmt.Sprintf("%v", []string(p))
}

// ToolProperty is one property of a tool's parameter schema.
type ToolProperty struct {
	AnyOf       []ToolProperty `json:"anyOf,omitempty"`
	Type        PropertyType   `json:"type,omitempty"`
	Items       interface{}    `json:"items,omitempty"`
	Description string         `json:"description,omitempty"`
	Enum        []interface{}  `json:"enum,omitempty"`
	Properties  *orderedProps  `json:"properties,omitempty"`
	Required    []string       `json:"required,omitempty"`
}

func tsType(name string) string {
	switch name {
	case "string":
		return "string"
	case "number", "integer":
		return "number"
	case "boolean":
		return "boolean"
	case "array":
		return "any[]"
	case "object":
		return "Record<string, any>"
	case "null":
		return "null"
	}
	return "any"
}

// TypeScript renders the property's type the way Ollama's toTypeScriptType function does.
func (p ToolProperty) TypeScript() string {
	var parts []string
	switch {
	case len(p.AnyOf) > 0:
		for _, a := range p.AnyOf {
			parts = append(parts, a.TypeScript())
		}
	case len(p.Type) == 0:
		return "any"
	default:
		for _, t := range p.Type {
			parts = append(parts, tsType(t))
		}
	}
	return strings.Join(parts, " | ")
}

// orderedProps keeps a nested "properties" object in the order the client sent it (Ollama does too).
type orderedProps struct {
	keys   []string
	values map[string]ToolProperty
}

func (o *orderedProps) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return errors.New("properties must be a JSON object")
	}
	o.values = map[string]ToolProperty{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key := tok.(string)
		var p ToolProperty
		if err := dec.Decode(&p); err != nil {
			return err
		}
		if _, seen := o.values[key]; !seen {
			o.keys = append(o.keys, key)
		}
		o.values[key] = p
	}
	_, err = dec.Token()
	return err
}

func (o orderedProps) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		vb, err := json.Marshal(o.values[k])
		if err != nil {
			return nil, err
		}
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(vb)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

func (o *orderedProps) plain() map[string]ToolProperty {
	if o == nil {
		return nil
	}
	return o.values
}

// Properties prints as JSON and ranges in sorted key order (a Go map), as in Ollama.
type Properties map[string]ToolProperty

func (p Properties) String() string {
	if p == nil {
		return "{}"
	}
	b, _ := json.Marshal(p)
	return string(b)
}

// Arguments prints as JSON and ranges in sorted key order (a Go map), as in Ollama.
type Arguments map[string]interface{}

func (a Arguments) String() string {
	if a == nil {
		return "{}"
	}
	b, _ := json.Marshal(a)
	return string(b)
}

type Parameters struct {
	Type       string      `json:"type"`
	Defs       interface{} `json:"$defs,omitempty"`
	Items      interface{} `json:"items,omitempty"`
	Required   []string    `json:"required,omitempty"`
	Properties Properties  `json:"properties"`
}

type Function struct {
	Name        string     `json:"name"`
	Description string     `json:"description"`
	Parameters  Parameters `json:"parameters"`
}

type Tool struct {
	Type     string      `json:"type"`
	Items    interface{} `json:"items,omitempty"`
	Function Function    `json:"function"`
}

func (t Tool) String() string {
	b, _ := json.Marshal(t)
	return string(b)
}

type Tools []Tool

func (t Tools) String() string {
	b, _ := json.Marshal(t)
	return string(b)
}

type CallFunction struct {
	Index     int
	Name      string
	Arguments Arguments
}

type ToolCall struct {
	ID       string
	Function CallFunction
}

type Message struct {
	Role       string
	Content    string
	Thinking   string
	Images     []string
	ToolCalls  []ToolCall
	ToolName   string
	ToolCallID string
}

// ---------------------------------------------------------------- pre-processing Ollama applies

// collate joins every system message into one system text and merges consecutive messages of the
// same role (tool messages excepted) with a blank line, keeping the system messages in the list.
func collate(in []apiMessage) (string, []*Message) {
	var system []string
	var out []*Message
	for _, m := range in {
		role := strings.ToLower(m.Role)
		if role == "system" {
			system = append(system, m.Content)
		}
		if n := len(out); n > 0 && out[n-1].Role == role && role != "tool" {
			out[n-1].Content += "\n\n" + m.Content
			continue
		}
		msg := &Message{
			Role: role, Content: m.Content, Thinking: m.Thinking, Images: m.Images,
			ToolName: m.ToolName, ToolCallID: m.ToolCallID,
		}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{
				ID: tc.ID,
				Function: CallFunction{
					Index: tc.Function.Index, Name: tc.Function.Name, Arguments: Arguments(tc.Function.Arguments),
				},
			})
		}
		out = append(out, msg)
	}
	return strings.Join(system, "\n\n"), out
}

func templateTools(in []apiTool) Tools {
	if in == nil {
		return nil
	}
	out := make(Tools, len(in))
	for i, t := range in {
		p := t.Function.Parameters
		out[i] = Tool{
			Type:  t.Type,
			Items: t.Items,
			Function: Function{
				Name:        t.Function.Name,
				Description: t.Function.Description,
				Parameters: Parameters{
					Type: p.Type, Defs: p.Defs, Items: p.Items, Required: p.Required,
					Properties: Properties(p.Properties.plain()),
				},
			},
		}
	}
	return out
}

// think returns .Think, .ThinkLevel and .IsThinkSet for a request's "think" value.
func think(v interface{}) (bool, string, bool, error) {
	switch t := v.(type) {
	case nil:
		return false, "", false, nil
	case bool:
		if t {
			return true, "medium", true, nil
		}
		return false, "", true, nil
	case string:
		switch t {
		case "low", "medium", "high", "max":
			return true, t, true, nil
		}
	}
	return false, "", false, fmt.Errorf("think must be a boolean or one of low, medium, high, max; got %v", v)
}

// ---------------------------------------------------------------- template functions

func funcs(today time.Time) template.FuncMap {
	return template.FuncMap{
		"json": func(v interface{}) string {
			b, _ := json.Marshal(v)
			return string(b)
		},
		// Ollama accepts a format argument and ignores it: always YYYY-MM-DD.
		"currentDate": func(args ...string) string { return today.Format("2006-01-02") },
		"yesterdayDate": func(args ...string) string {
			return today.AddDate(0, 0, -1).Format("2006-01-02")
		},
		"toTypeScriptType": func(v interface{}) string {
			switch p := v.(type) {
			case ToolProperty:
				return p.TypeScript()
			case *ToolProperty:
				if p != nil {
					return p.TypeScript()
				}
			}
			return "any"
		},
	}
}

// ---------------------------------------------------------------- parse-tree helpers

// identifiers lists the field and variable names a node mentions, as Ollama's template.Vars does.
func identifiers(n parse.Node) ([]string, error) {
	var out []string
	var visit func(parse.Node) error
	visit = func(n parse.Node) error {
		switch t := n.(type) {
		case *parse.ListNode:
			if t == nil {
				return nil
			}
			for _, c := range t.Nodes {
				if err := visit(c); err != nil {
					return err
				}
			}
		case *parse.TemplateNode:
			if t.Pipe == nil {
				return errors.New("undefined template specified")
			}
			return visit(t.Pipe)
		case *parse.ActionNode:
			if t.Pipe == nil {
				return errors.New("undefined action in template")
			}
			return visit(t.Pipe)
		case *parse.IfNode:
			return visitBranch(&t.BranchNode, visit)
		case *parse.RangeNode:
			return visitBranch(&t.BranchNode, visit)
		case *parse.WithNode:
			return visitBranch(&t.BranchNode, visit)
		case *parse.PipeNode:
			for _, c := range t.Cmds {
				for _, a := range c.Args {
					if err := visit(a); err != nil {
						return err
					}
				}
			}
		case *parse.FieldNode:
			out = append(out, t.Ident...)
		case *parse.VariableNode:
			out = append(out, t.Ident...)
		}
		return nil
	}
	err := visit(n)
	return out, err
}

func visitBranch(b *parse.BranchNode, visit func(parse.Node) error) error {
	if b.Pipe == nil {
		return errors.New("undefined branch")
	}
	if err := visit(b.Pipe); err != nil {
		return err
	}
	if err := visit(b.List); err != nil {
		return err
	}
	if b.ElseList != nil {
		return visit(b.ElseList)
	}
	return nil
}

func vars(t *template.Template) (map[string]bool, error) {
	found := map[string]bool{}
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		for _, n := range tt.Tree.Root.Nodes {
			ids, err := identifiers(n)
			if err != nil {
				return nil, err
			}
			for _, id := range ids {
				found[strings.ToLower(id)] = true
			}
		}
	}
	return found, nil
}

// cutAfterResponse drops everything that follows the first {{ .Response }} field in an action, the
// way Ollama ends the last turn of a legacy template just where the model's answer begins. Branch
// conditions and range/with pipes are not searched (Ollama does not search them either).
func cutAfterResponse(root *parse.ListNode) *parse.ListNode {
	cut := false
	var list func(*parse.ListNode) *parse.ListNode
	var node func(parse.Node) parse.Node
	var pipe func(*parse.PipeNode) *parse.PipeNode
	pipe = func(p *parse.PipeNode) *parse.PipeNode {
		var cmds []*parse.CommandNode
		for _, c := range p.Cmds {
			var args []parse.Node
			for _, a := range c.Args {
				if kept := node(a); kept != nil {
					args = append(args, kept)
				}
			}
			if len(args) > 0 {
				c.Args = args
				cmds = append(cmds, c)
			}
		}
		if len(cmds) == 0 {
			return nil
		}
		p.Cmds = cmds
		return p
	}
	branch := func(b *parse.BranchNode) {
		b.List = list(b.List)
		if b.ElseList != nil {
			b.ElseList = list(b.ElseList)
		}
	}
	node = func(n parse.Node) parse.Node {
		if f, ok := n.(*parse.FieldNode); ok {
			for _, id := range f.Ident {
				if id == "Response" {
					cut = true
					return n
				}
			}
		}
		if cut {
			return nil
		}
		switch t := n.(type) {
		case *parse.ListNode:
			return list(t)
		case *parse.IfNode:
			branch(&t.BranchNode)
		case *parse.RangeNode:
			branch(&t.BranchNode)
		case *parse.WithNode:
			branch(&t.BranchNode)
		case *parse.ActionNode:
			if p := pipe(t.Pipe); p != nil {
				t.Pipe = p
			} else {
				return nil
			}
		case *parse.PipeNode:
			if p := pipe(t); p != nil {
				return p
			}
			return nil
		}
		return n
	}
	list = func(l *parse.ListNode) *parse.ListNode {
		if l == nil {
			return nil
		}
		if cut {
			return &parse.ListNode{NodeType: parse.NodeList, Pos: l.Pos}
		}
		var nodes []parse.Node
		for _, c := range l.Nodes {
			if kept := node(c); kept != nil {
				nodes = append(nodes, kept)
			}
		}
		l.Nodes = nodes
		return l
	}
	return list(root)
}

// ---------------------------------------------------------------- rendering

func render(req request) (string, error) {
	today := time.Now()
	if req.Data.Now != "" {
		d, err := time.Parse("2006-01-02", req.Data.Now)
		if err != nil {
			return "", fmt.Errorf("now: %w", err)
		}
		today = d
	}
	fm := funcs(today)
	tmpl, err := template.New("").Option("missingkey=zero").Funcs(fm).Parse(req.Template)
	if err != nil {
		return "", err
	}
	used, err := vars(tmpl)
	if err != nil {
		return "", err
	}
	if !used["messages"] && !used["response"] {
		tmpl.Tree.Root.Nodes = append(tmpl.Tree.Root.Nodes, responseAction())
	}
	thinkOn, thinkLevel, thinkSet, err := think(req.Data.Think)
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	d := req.Data
	if d.Prompt != "" && d.Suffix != "" {
		err = tmpl.Execute(&out, map[string]interface{}{
			"Prompt": d.Prompt, "Suffix": d.Suffix, "Response": "",
			"Think": thinkOn, "ThinkLevel": thinkLevel, "IsThinkSet": thinkSet,
		})
		return out.String(), err
	}
	system, messages := collate(d.Messages)
	if used["messages"] {
		err = tmpl.Execute(&out, map[string]interface{}{
			"System": system, "Messages": messages, "Tools": templateTools(d.Tools), "Response": "",
			"Think": thinkOn, "ThinkLevel": thinkLevel, "IsThinkSet": thinkSet,
		})
		return out.String(), err
	}

	// Legacy templates: one rendering per user→assistant turn.
	turn := map[string]string{"System": "", "Prompt": "", "Response": ""}
	values := func() map[string]interface{} {
		return map[string]interface{}{
			"System": turn["System"], "Prompt": turn["Prompt"], "Response": turn["Response"],
			"Think": thinkOn, "ThinkLevel": thinkLevel, "IsThinkSet": thinkSet,
		}
	}
	flush := func() error {
		if err := tmpl.Execute(&out, values()); err != nil {
			return err
		}
		turn = map[string]string{"System": "", "Prompt": "", "Response": ""}
		return nil
	}
	for _, m := range messages {
		switch m.Role {
		case "system":
			if turn["Prompt"] != "" || turn["Response"] != "" {
				if err := flush(); err != nil {
					return "", err
				}
			}
			turn["System"] = m.Content
		case "user":
			if turn["Response"] != "" {
				if err := flush(); err != nil {
					return "", err
				}
			}
			turn["Prompt"] = m.Content
		case "assistant":
			turn["Response"] = m.Content
		}
	}
	last := tmpl.Tree.Root.CopyList()
	last = cutAfterResponse(last)
	final, err := template.New("").Option("missingkey=zero").Funcs(fm).AddParseTree("", &parse.Tree{Root: last})
	if err != nil {
		return "", err
	}
	for _, tt := range tmpl.Templates() {
		if tt.Name() != "" && tt.Tree != nil {
			if _, err := final.AddParseTree(tt.Name(), tt.Tree); err != nil {
				return "", err
			}
		}
	}
	if err := final.Execute(&out, values()); err != nil {
		return "", err
	}
	return out.String(), nil
}

// ---------------------------------------------------------------- what Ollama infers from a template

type analysis struct {
	Vars []string `json:"vars"`
	// ToolTag is where Ollama's tool-call parser expects a call to start in the model's output: the
	// first text inside the first {{ if .ToolCalls }} (cut before any "{"), or "{" for bare JSON.
	ToolTag string `json:"tool_tag"`
	// ThinkingTags are the texts around {{ .Thinking }} inside a range over .Messages, which Ollama
	// takes as the tags that open and close a thinking trace; empty when the template declares none.
	ThinkingTags []string `json:"thinking_tags"`
}

func analyze(src string) (analysis, error) {
	tmpl, err := template.New("").Option("missingkey=zero").Funcs(funcs(time.Now())).Parse(src)
	if err != nil {
		return analysis{}, err
	}
	used, err := vars(tmpl)
	if err != nil {
		return analysis{}, err
	}
	a := analysis{Vars: []string{}, ToolTag: toolTag(tmpl.Tree.Root.Nodes), ThinkingTags: []string{}}
	for v := range used {
		a.Vars = append(a.Vars, v)
	}
	sort.Strings(a.Vars)
	if open, closing := thinkingTags(tmpl.Tree.Root); open != "" && closing != "" {
		a.ThinkingTags = []string{open, closing}
	}
	return a, nil
}

func mentionsToolCalls(p *parse.PipeNode) bool {
	for _, c := range p.Cmds {
		for _, a := range c.Args {
			if f, ok := a.(*parse.FieldNode); ok {
				for _, id := range f.Ident {
					if id == "ToolCalls" {
						return true
					}
				}
			}
		}
	}
	return false
}

func branchOf(n parse.Node) *parse.BranchNode {
	switch t := n.(type) {
	case *parse.IfNode:
		return &t.BranchNode
	case *parse.RangeNode:
		return &t.BranchNode
	case *parse.WithNode:
		return &t.BranchNode
	}
	return nil
}

func findToolCallIf(nodes []parse.Node) *parse.IfNode {
	for _, n := range nodes {
		if l, ok := n.(*parse.ListNode); ok {
			if found := findToolCallIf(l.Nodes); found != nil {
				return found
			}
			continue
		}
		if i, ok := n.(*parse.IfNode); ok && mentionsToolCalls(i.Pipe) {
			return i
		}
		if b := branchOf(n); b != nil {
			for _, l := range []*parse.ListNode{b.List, b.ElseList} {
				if l != nil {
					if found := findToolCallIf(l.Nodes); found != nil {
						return found
					}
				}
			}
		}
	}
	return nil
}

// firstText finds the first non-blank text before any action, looking into nested branches.
func firstText(nodes []parse.Node) *parse.TextNode {
	for _, n := range nodes {
		switch t := n.(type) {
		case *parse.TextNode:
			if len(bytes.TrimSpace(t.Text)) > 0 {
				return t
			}
		case *parse.ListNode:
			if found := firstText(t.Nodes); found != nil {
				return found
			}
		case *parse.ActionNode:
			return nil
		default:
			if b := branchOf(n); b != nil {
				for _, l := range []*parse.ListNode{b.List, b.ElseList} {
					if l != nil {
						if found := firstText(l.Nodes); found != nil {
							return found
						}
					}
				}
				return nil
			}
		}
	}
	return nil
}

func toolTag(nodes []parse.Node) string {
	i := findToolCallIf(nodes)
	if i == nil {
		return "{"
	}
	t := firstText(i.List.Nodes)
	if t == nil {
		return "{"
	}
	tag := strings.ReplaceAll(string(t.Text), "\r\n", "\n")
	if at := strings.Index(tag, "{"); at >= 0 {
		tag = tag[:at]
	}
	if tag = strings.TrimSpace(tag); tag == "" {
		return "{"
	}
	return tag
}

func pipeMentions(p *parse.PipeNode, field string) bool {
	found := false
	var visit func(parse.Node)
	visit = func(n parse.Node) {
		switch t := n.(type) {
		case *parse.PipeNode:
			for _, c := range t.Cmds {
				visit(c)
			}
		case *parse.CommandNode:
			for _, a := range t.Args {
				visit(a)
			}
		case *parse.FieldNode:
			if len(t.Ident) > 0 && t.Ident[0] == field {
				found = true
			}
		}
	}
	if p != nil {
		visit(p)
	}
	return found
}

// thinkingTags walks the tree keeping the path from the root; at a {{ .Thinking }} inside a range over
// .Messages, the nearest enclosing list's first and last text nodes are the tags (the last match wins).
func thinkingTags(root *parse.ListNode) (string, string) {
	var open, closing string
	var path []parse.Node
	var visit func(parse.Node)
	visit = func(n parse.Node) {
		if n == nil {
			return
		}
		path = append(path, n)
		defer func() { path = path[:len(path)-1] }()
		switch t := n.(type) {
		case *parse.FieldNode:
			if len(t.Ident) == 0 || t.Ident[0] != "Thinking" {
				return
			}
			var rng *parse.RangeNode
			for i := len(path) - 1; i >= 0 && rng == nil; i-- {
				rng, _ = path[i].(*parse.RangeNode)
			}
			if rng == nil || !pipeMentions(rng.Pipe, "Messages") {
				return
			}
			for i := len(path) - 1; i >= 0; i-- {
				if l, ok := path[i].(*parse.ListNode); ok {
					if first, ok := l.Nodes[0].(*parse.TextNode); ok {
						open = strings.TrimSpace(first.String())
					}
					if last, ok := l.Nodes[len(l.Nodes)-1].(*parse.TextNode); ok {
						closing = strings.TrimSpace(last.String())
					}
					return
				}
			}
		case *parse.ListNode:
			for _, c := range t.Nodes {
				visit(c)
			}
		case *parse.ActionNode:
			visit(t.Pipe)
		case *parse.TemplateNode:
			if t.Pipe != nil {
				visit(t.Pipe)
			}
		case *parse.PipeNode:
			for _, c := range t.Cmds {
				visit(c)
			}
		case *parse.CommandNode:
			for _, a := range t.Args {
				visit(a)
			}
		default:
			if b := branchOf(n); b != nil {
				path = append(path, b)
				visit(b.Pipe)
				if b.List != nil {
					visit(b.List)
				}
				if b.ElseList != nil {
					visit(b.ElseList)
				}
				path = path[:len(path)-1]
			}
		}
	}
	visit(root)
	return open, closing
}

func responseAction() *parse.ActionNode {
	return &parse.ActionNode{
		NodeType: parse.NodeAction,
		Pipe: &parse.PipeNode{
			NodeType: parse.NodePipe,
			Cmds: []*parse.CommandNode{{
				NodeType: parse.NodeCommand,
				Args:     []parse.Node{&parse.FieldNode{NodeType: parse.NodeField, Ident: []string{"Response"}}},
			}},
		},
	}
}

type result struct {
	Output *string `json:"output,omitempty"`
	Error  *string `json:"error,omitempty"`
}

func main() {
	var in io.Reader = os.Stdin
	if len(os.Args) > 1 {
		f, err := os.Open(os.Args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer f.Close()
		in = f
	}
	raw, err := io.ReadAll(in)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var req request
	if err := json.Unmarshal(raw, &req); err != nil {
		fmt.Fprintln(os.Stderr, "bad request:", err)
		os.Exit(2)
	}
	if req.Analyze {
		a, err := analyze(req.Template)
		if err != nil {
			fmt.Fprintln(os.Stderr, "analyze:", err)
			os.Exit(1)
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(a); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		return
	}
	if req.Batch == nil {
		s, err := render(req)
		if err != nil {
			fmt.Fprintln(os.Stderr, "render:", err)
			os.Exit(1)
		}
		os.Stdout.WriteString(s)
		return
	}
	var reqs []json.RawMessage
	if err := json.Unmarshal(req.Batch, &reqs); err != nil {
		fmt.Fprintln(os.Stderr, "bad batch:", err)
		os.Exit(2)
	}
	results := make([]result, len(reqs))
	for i, r := range reqs {
		var one request
		err := json.Unmarshal(r, &one)
		var s string
		if err == nil {
			s, err = render(one)
		}
		if err != nil {
			msg := err.Error()
			results[i].Error = &msg
		} else {
			results[i].Output = &s
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}
