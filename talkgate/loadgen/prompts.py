"""The built-in benchmark texts: English, Chinese and mixed Chinese/English, in three length buckets.

Buckets count characters: short < 50, medium 50-200, long > 200 (tests/unit/test_loadgen.py checks it).
The texts read like what a voice agent says: confirmations, directions, explanations, stories.
`talkgate bench --dump-prompts` prints them (with ids and the frame count each is benchmarked at)
so other tools, e.g. the reference baseline, time the same texts.
"""
from __future__ import annotations

LANGS = ("en", "zh", "mixed")
BUCKETS = ("short", "medium", "long")
BUCKET_CHARS = {"short": (1, 49), "medium": (50, 200), "long": (201, 4096)}   # inclusive
# The `language` each prompt is sent with (Qwen3-TTS language names; mixed text is mostly Chinese).
LANGUAGE = {"en": "english", "zh": "chinese", "mixed": "chinese"}

EN_SHORT = [
    "Hello, how can I help you today?",
    "Your order has shipped.",
    "Sure, one moment please.",
    "The meeting starts at three o'clock.",
    "I didn't catch that. Could you repeat it?",
    "Thanks for calling. Goodbye!",
    "Your balance is forty-two dollars.",
    "Yes, that works for me.",
    "Please hold while I transfer you.",
    "It will be sunny and warm tomorrow.",
]

EN_MEDIUM = [
    "I found three flights to Boston on Friday morning. The earliest leaves at six fifteen and arrives "
    "just after eight.",
    "Your appointment with Doctor Patel is confirmed for Tuesday, March fourth, at ten thirty. Please "
    "arrive fifteen minutes early.",
    "To reset your password, open the settings page, choose security, and follow the link we just sent "
    "to your email address.",
    "The package was delivered to your front door at two forty this afternoon. A photo of the delivery "
    "is in the app.",
    "I'm sorry, but that item is out of stock right now. Would you like me to tell you when it's "
    "available again?",
    "Traffic is heavy near exit twelve, so the fastest route today goes through the city center instead.",
    "Your total comes to eighty-seven dollars and fifty cents, including tax. Shall I charge the card on "
    "file?",
    "Great question! Photosynthesis is how plants turn sunlight, water and carbon dioxide into sugar and "
    "oxygen.",
    "The library closes early on Sundays, at four in the afternoon, but the online catalog is open at "
    "any time.",
    "Let me check that for you. It looks like your subscription renews on the first of next month.",
]

EN_LONG = [
    "Here is the forecast for the weekend. Saturday starts cloudy with a chance of light rain before "
    "noon, then clears up in the afternoon with highs around sixty-eight degrees. Sunday looks sunny and "
    "a little warmer, so it is a good day for the farmers market or a walk along the river. Bring a "
    "light jacket for the evenings, when temperatures drop into the low fifties.",
    "I can see why the bill looks higher than usual. Last month you were on the promotional rate, which "
    "ended on the fifteenth, so this statement includes half a month at the old price and half at the "
    "regular price. I have applied a one-time credit of ten dollars, and if you would like, I can move "
    "you to the annual plan, which works out cheaper than paying month by month.",
    "Once upon a time, in a village at the edge of a great forest, there lived a clockmaker who never "
    "slept. Every night he sat at his bench, fixing the watches of travelers who passed through. One "
    "evening a girl brought him a clock with no hands at all, and asked him to teach it to tell the "
    "time. He smiled, put down his tools, and began to listen.",
    "Let's make a simple tomato soup. Warm two spoons of olive oil in a large pot, then add one chopped "
    "onion and two cloves of garlic. Cook them slowly for about eight minutes, until they are soft and "
    "sweet. Add a large can of crushed tomatoes, two cups of vegetable stock and a pinch of salt. Let it "
    "simmer for twenty minutes, blend until smooth, and finish with a little cream.",
    "A streaming speech system has two jobs that pull against each other. It should start talking as "
    "soon as possible, so the listener does not notice a pause, and it should never stop in the middle "
    "of a sentence, because a gap in the audio sounds broken. The trick is to produce the first few "
    "hundred milliseconds quickly and then stay comfortably ahead of the playback clock.",
    "From the main entrance, walk straight past the information desk and take the elevators on your "
    "left up to the fourth floor. When the doors open, turn right and follow the blue signs toward "
    "radiology. The waiting room is at the end of the corridor, next to the vending machines. If you get "
    "lost, any staff member in a green uniform will be happy to point the way.",
    "The first transatlantic telegraph cable was completed in the summer of eighteen fifty-eight. For a "
    "few weeks, messages that once took ten days by ship crossed the ocean in minutes, and Queen "
    "Victoria exchanged greetings with President Buchanan. Then the signal faded and the cable failed "
    "completely. A lasting connection had to wait until eighteen sixty-six.",
    "Your policy covers accidental damage to the phone, including cracked screens and water damage, up "
    "to two claims in any twelve-month period. Each claim has a deductible of forty-nine dollars. Theft "
    "and loss are covered only if you report them to the police within forty-eight hours and send us a "
    "copy of the report. Cosmetic scratches that do not affect use are not covered.",
    "For your first week, keep things gentle. On Monday, Wednesday and Friday, walk briskly for twenty "
    "minutes and then do two rounds of ten squats, ten wall push-ups and a thirty-second plank. On the "
    "other days, stretch for ten minutes in the morning. Drink plenty of water, sleep at least seven "
    "hours, and tell me how your knees feel so we can adjust next week's plan.",
    "In today's headlines: the city council approved the new bike lane plan after a long debate, with "
    "construction on the first section expected to begin in April. Meanwhile, the local football team "
    "won its third match in a row, and forecasters say the cold snap will end by Thursday. Finally, the "
    "public library is extending its opening hours during exam season.",
]

ZH_SHORT = [
    "你好，请问有什么可以帮您？",
    "您的订单已经发货了。",
    "好的，请稍等一下。",
    "会议下午三点开始。",
    "抱歉，我没有听清楚，请您再说一遍。",
    "感谢您的来电，再见！",
    "您的账户余额是四十二元。",
    "明天天气晴朗，最高气温二十五度。",
    "正在为您转接人工客服，请不要挂机。",
    "没问题，我马上帮您预订。",
]

ZH_MEDIUM = [
    "我帮您查到了三趟周五上午去北京的航班，最早的一班六点十五分起飞，八点过后到达，请问您想预订哪一班呢？",
    "您和王医生的预约已经确认，时间是下周二上午十点半，地点在门诊楼三层，请您提前十五分钟到达并带好医保卡。",
    "如果要重置密码，请打开设置页面，选择账户与安全，然后点击我们刚刚发送到您手机上的验证链接，按照提示操作就可以了。",
    "您的包裹已于今天下午两点四十分送到家门口，快递员拍了照片作为签收凭证，您可以在应用的订单详情里查看。",
    "非常抱歉，这款商品目前暂时缺货，预计下周补货。需要我在到货的时候第一时间发短信通知您吗？您也可以先看看其他颜色。",
    "现在高速公路十二号出口附近比较拥堵，今天走市中心的路线会更快一些，大约能节省二十分钟左右的时间，需要我现在为您导航吗？",
    "您这次一共消费八十七元五角，已经包含了服务费。请问是使用绑定的银行卡支付，还是换一种支付方式呢？开具发票也可以告诉我。",
    "这个问题问得好！光合作用就是植物利用阳光，把水和二氧化碳转变成糖和氧气的过程，这也是大多数生命的能量来源。",
    "图书馆周日下午四点提前闭馆，不过网上的借阅系统全天开放，您可以随时在线续借或者预约想看的书，也可以查询新书信息。",
    "我来帮您查一下。您的会员服务将在下个月一号自动续费，如果不想续费，可以在到期前三天内随时在应用里取消。",
]

ZH_LONG = [
    "下面是本周末的天气预报。周六上午多云，中午前后可能有小雨，下午转晴，最高气温二十度左右，早晚温差比较大。"
    "周日全天晴朗，气温略有回升，非常适合去公园散步或者逛逛早市。晚上气温会降到十度以下，出门的时候记得带一件外套。"
    "另外，周日下午紫外线比较强，户外活动请注意防晒，多喝水。下周一开始又会有一次降温过程，请大家提前做好准备，老人和孩子尤其要注意保暖，开车出行的朋友也请留意路面情况，雨天路滑，请减速慢行，保持安全车距。",
    "我理解您对这个月账单的疑问。上个月您享受的是新用户优惠价，优惠在十五号到期，所以这期账单里有半个月按优惠价计算，"
    "另外半个月按正常价格计算，总额就比以前高了一些。为了表示歉意，我已经为您申请了十元的一次性补偿，会在下期账单中抵扣。"
    "如果您愿意，我也可以帮您换成年付套餐，平均下来每个月比现在便宜不少，而且全年都不用再担心价格变动的问题。请问您还有其他需要我帮忙处理的事情吗？我会把今天的处理结果以短信的形式发给您。",
    "从前，在一片大森林的边上，有一个小村庄，村子里住着一位从来不睡觉的钟表匠。每天晚上，他都坐在工作台前，"
    "为路过的旅人修理怀表。有一天傍晚，一个小女孩抱着一座没有指针的钟走进店里，请他教这座钟认识时间。"
    "钟表匠笑了笑，放下手里的工具，把耳朵贴在钟面上，静静地听了很久。过了一会儿，他轻声说，这座钟其实一直都知道时间，"
    "它只是在等一个愿意听它说话的人。从那以后，小女孩每天傍晚都会来店里，和钟表匠一起听钟说话，一直听到月亮升起。",
    "我们来做一道简单的番茄鸡蛋汤。先把两个番茄洗干净，切成小块，再把三个鸡蛋打散备用。锅里倒一点油，烧热以后放入番茄，"
    "小火翻炒两三分钟，直到番茄出汁变软。然后加入大约一升清水，大火烧开，再转中火煮五分钟。接着把鸡蛋液沿着锅边慢慢倒进去，"
    "等蛋花浮起来以后轻轻搅拌一下。最后加一点盐和几滴香油，撒上葱花，一锅酸甜可口的番茄鸡蛋汤就做好了。这道汤做法简单，营养丰富，特别适合忙碌的工作日晚上，配上一碗米饭就是一顿很舒服的晚餐。",
    "流式语音合成系统需要同时做好两件相互矛盾的事情。一方面，它要尽快开始说话，让听的人感觉不到明显的停顿；另一方面，"
    "它在说话的过程中绝对不能卡住，因为音频中间一旦出现空白，听起来就像是系统出了故障。解决的办法是尽快生成最开始的几百毫秒音频，"
    "然后始终保持生成速度比播放速度快一些，让缓冲区里总有足够的音频。同时，服务器要合理安排多个请求的先后顺序，"
    "优先照顾那些缓冲区快要用完的请求，这样才能在高并发的情况下保证每一路语音都流畅。",
    "从医院正门进来以后，请直走经过服务台，在左手边乘坐电梯到四楼。出电梯以后向右转，沿着地上的蓝色指示线一直往前走，"
    "就能看到放射科的标志。候诊区在走廊的尽头，旁边有自动售货机和饮水机。挂号单上有您的排队号码，请留意屏幕上的叫号信息。"
    "如果找不到路，可以随时询问穿绿色制服的工作人员，他们都很乐意为您指路。检查结束以后，报告一般会在两个小时内上传到手机应用里，到时候会有短信提醒您查看。祝您检查顺利，早日康复。",
    "第一条横跨大西洋的电报电缆在一八五八年夏天铺设完成。在短短几个星期里，过去需要轮船航行十天才能送达的消息，"
    "只用几分钟就能跨越大洋，英国女王和美国总统还互相发送了贺电。可惜好景不长，电缆的信号越来越弱，最后彻底中断了。"
    "工程师们总结了失败的教训，改进了电缆的绝缘材料和铺设方法。直到一八六六年，一条能够长期稳定工作的电缆才终于铺设成功，"
    "从此欧洲和美洲之间的通信进入了一个全新的时代。今天，海底光缆承载着全球绝大部分的国际数据流量，每秒钟传输的信息量是当年的无数倍。",
    "您购买的保险涵盖手机的意外损坏，包括屏幕碎裂和进水损坏，在任意连续十二个月内最多可以理赔两次，每次理赔需要自付四十九元。"
    "被盗和丢失只有在四十八小时内向公安机关报案，并把报案回执的照片上传给我们的情况下才能理赔。不影响正常使用的轻微划痕不在保障范围之内。"
    "申请理赔的时候，请准备好购机发票、保单号码和损坏部位的照片，审核通过以后，维修费用会直接结算给授权维修点，您不需要先垫付任何费用。如果对理赔结果有疑问，可以在收到通知后的三十天内提出复核申请。",
    "第一周的训练我们循序渐进。周一、周三和周五，先快走二十分钟，然后做两组练习，每组包括十个深蹲、十个靠墙俯卧撑和三十秒的平板支撑。"
    "其余几天，每天早上拉伸十分钟，放松肩膀、腰背和腿部的肌肉。训练期间要多喝水，每天保证至少七个小时的睡眠，饮食尽量清淡，"
    "少吃油炸食品和甜食。如果膝盖或者腰部有任何不舒服的感觉，请马上停下来休息，并告诉我具体的情况，我们再一起调整下周的计划。坚持下去，一个月以后您一定会感觉到身体的变化。",
    "下面是今天的新闻摘要。市议会经过长时间的讨论，终于通过了新的自行车道建设方案，第一段工程预计在明年四月开工，"
    "建成以后将连接大学城和火车站。体育方面，本市足球队昨晚在主场以二比一战胜对手，取得了三连胜，目前在积分榜上排名第二。"
    "天气方面，气象部门表示这轮寒潮将在周四结束，之后气温会逐步回升。最后提醒大家，市图书馆在考试期间将延长开放时间，每天晚上开到十一点。以上就是今天的新闻摘要，感谢您的收听，我们明天同一时间再见。",
]

MIXED_SHORT = [
    "请打开 Settings 页面。",
    "我的 iPhone 连不上 Wi-Fi 了。",
    "明天的 meeting 改到下午三点。",
    "你的 email 地址是多少？",
    "这个 bug 已经修好了。",
    "帮我订一杯 latte，谢谢。",
    "今天的 stand-up 取消了。",
    "请把 PDF 文件发给我。",
    "我们用 Python 写这个脚本。",
    "你的 Uber 司机快到了。",
]

MIXED_MEDIUM = [
    "我已经把 quarterly report 发到你的邮箱了，里面有上个季度的 revenue 和 user growth 数据，麻烦你周五之前看一下。",
    "如果你的 Bluetooth 耳机连不上，先在手机的 Settings 里面把设备删掉，然后长按耳机上的按钮五秒钟，重新配对就可以了。",
    "下周的 team building 我们定在周六上午，先去爬山，中午在山脚下的 BBQ 餐厅吃饭，下午自由活动，晚上六点之前结束。",
    "这个 API 的 rate limit 是每分钟一百次请求，如果超过了会返回 429 错误，建议你在 client 端加一个 retry 机制。",
    "你好，我是你的 AI assistant。我可以帮你查天气、订机票、设置 reminder，也可以陪你聊聊天，请问现在需要什么帮助？",
    "我们的 app 新版本已经上线了，增加了 dark mode 和离线下载功能，还修复了几个大家反馈比较多的 crash 问题。",
    "这次 conference 的 keynote 安排在第一天上午九点，主讲人会介绍最新的 large language model 研究进展和应用案例。",
    "你的 Amazon 订单里有两件商品已经发货，tracking number 会通过短信发给你，另外一件预计下周三到货。",
    "请在 GitHub 上提交一个 pull request，然后在 description 里写清楚改动的原因，我会在今天下班前帮你 review。",
    "周末我们去 Costco 买点东西吧，顺便在旁边的 Starbucks 喝杯咖啡，我听说他们新出了一款 seasonal drink。",
]

MIXED_LONG = [
    "关于下个季度的 product roadmap，我简单说一下。第一，我们会把 onboarding 流程从五步减少到三步，目标是把新用户的 "
    "conversion rate 提高百分之十。第二，search 功能会接入新的 ranking model，让搜索结果更准确。第三，我们会推出 "
    "team plan，支持多人协作和统一账单。每个项目都有对应的 owner，具体的 timeline 我会在会后发到 Slack 频道里，"
    "有问题的话随时找我。",
    "如果你的 laptop 开机以后一直黑屏，可以按照下面的步骤试一试。先拔掉电源和所有 USB 设备，长按 power 键十五秒，"
    "然后重新接上电源开机。如果还是黑屏，试着外接一个 monitor，看看是不是屏幕本身的问题。要是外接显示器有画面，"
    "多半是屏幕排线松了，需要送去维修。如果外接也没有画面，可以尝试进入 BIOS 恢复默认设置。这些都不行的话，"
    "请带上购买凭证去最近的 service center 检测。",
    "这次去 Tokyo 的行程我已经安排好了。第一天上午到达 Narita 机场，坐 express 到酒店办理入住，下午去浅草寺和 "
    "Skytree 附近逛一逛。第二天去 Shibuya 和 Harajuku，晚上在新宿吃烤肉。第三天安排了一日游，去富士山附近的河口湖，"
    "如果天气好的话可以看到很漂亮的风景。最后一天上午自由活动，可以去 Ginza 买点东西，下午三点出发去机场。"
    "所有的预订确认邮件我都转发到你的 inbox 了。",
    "我们今天的 workshop 主要讲 machine learning 的基本概念。首先什么是 model：简单来说，它是一个根据 input 预测 "
    "output 的函数。训练的时候，我们准备大量带 label 的数据，让 model 不断调整自己的 parameters，使预测结果越来越接近正确答案。"
    "这个过程叫做 training，衡量预测好坏的标准叫做 loss function。训练完以后，我们要用 model 没见过的 test set 来评估它的效果，"
    "防止出现 overfitting 的问题。",
    "你好，欢迎致电 Horizon Bank 客户服务中心。查询账户余额和最近的交易记录，请按一；挂失或者补办 debit card，"
    "请按二；咨询 credit card 的分期付款和积分兑换，请按三；办理 online banking 的注册和密码重置，请按四；"
    "查询贷款进度或者预约理财经理，请按五；返回上一级菜单请按星号键，重听请按井号键。如需人工服务，请直接按零，"
    "我们的客服代表会尽快为您服务，感谢您的耐心等待。",
    "关于这次 production incident 的 postmortem，我先总结一下。周二晚上十点左右，database 的连接数突然打满，"
    "导致 API 大量返回 timeout。根本原因是新上线的 cron job 没有正确关闭连接，每分钟都在泄漏连接。on-call "
    "同事在二十分钟内定位到问题，rollback 之后服务恢复正常。后续我们会加上 connection pool 的监控和 alert，"
    "并且在 code review 的 checklist 里加一条资源释放的检查。",
    "我们这个 podcast 今天聊一聊 remote work。很多公司在过去几年里尝试了 hybrid 模式，员工每周来 office 两三天，"
    "其余时间在家工作。好处是节省了通勤时间，大家的 work-life balance 也更好了；缺点是团队沟通变得更依赖 Zoom "
    "和 Slack，新同事也比较难融入。我们邀请了两位嘉宾，一位是 startup 的 founder，一位是大公司的 HR director，"
    "听听他们的真实经验。",
    "这款 smart watch 的主要功能我给你介绍一下。它可以实时监测 heart rate 和血氧，晚上自动记录 sleep quality，"
    "早上起来在 app 里就能看到详细的睡眠报告。运动方面支持一百多种 workout 模式，内置 GPS，跑步的时候不用带手机也能记录轨迹。"
    "电池在正常使用情况下可以坚持十天左右，支持 wireless charging。另外它还有 NFC 功能，可以直接刷公交卡和门禁卡，非常方便。",
    "今天的 cooking class 我们来做 Italian pasta。先烧一大锅水，水开以后加一勺盐，放入 spaghetti 煮八到十分钟，"
    "保持 al dente 的口感。煮面的同时，在平底锅里放一点 olive oil，加入蒜末和 bacon 小火慢煎，直到 bacon 变得金黄酥脆。"
    "然后把煮好的面捞进锅里，加一勺煮面水、两个蛋黄和一大把 parmesan cheese，快速搅拌均匀，最后撒上黑胡椒就完成了。",
    "我想跟你 update 一下招聘的进度。这周我们一共面试了六位 software engineer 的候选人，其中两位进入了 final round，"
    "他们的 system design 和 coding 表现都很不错。另外 product manager 的岗位收到了三十多份简历，HR 已经初步筛选出八位，"
    "下周安排 phone screen。design 岗位目前还在等 headcount 批下来。如果你有合适的人选推荐，可以直接把 resume 发给我，"
    "我们会优先安排面试。",
]

PROMPTS = {
    "en": {"short": EN_SHORT, "medium": EN_MEDIUM, "long": EN_LONG},
    "zh": {"short": ZH_SHORT, "medium": ZH_MEDIUM, "long": ZH_LONG},
    "mixed": {"short": MIXED_SHORT, "medium": MIXED_MEDIUM, "long": MIXED_LONG},
}


def select(lang: str = "all", bucket: str = "all") -> list[dict]:
    """The prompts of one language and bucket ("all" for every one), each as
    {"id": "en-short-03", "lang", "bucket", "language", "text"}, in a stable order."""
    langs = LANGS if lang == "all" else (lang,)
    buckets = BUCKETS if bucket == "all" else (bucket,)
    for name, allowed in (("lang", LANGS), ("bucket", BUCKETS)):
        if not set(langs if name == "lang" else buckets) <= set(allowed):
            raise ValueError(f"unknown {name}: choose from {', '.join(allowed)} or all")
    return [{"id": f"{la}-{b}-{i:02d}", "lang": la, "bucket": b, "language": LANGUAGE[la], "text": text}
            for la in langs for b in buckets for i, text in enumerate(PROMPTS[la][b])]
